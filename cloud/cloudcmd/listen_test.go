package cloudcmd_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cloud/cloudcmd"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/internal/tlstest"
	"github.com/keel-runtime/keel/ipc/client"
)

// TestServeListen: `keel cloud serve --tenants F --listen ADDR
// --tls-cert C --tls-key K` serves keel/1 over wss:// to a tenant's
// client with its token (and refuses another token); --listen off
// loopback without TLS, and --listen without --tenants, are refused
// before anything starts.
func TestServeListen(t *testing.T) {
	t.Parallel()
	acme := natstest.Account{Name: "acme", Token: "acme-0123456789abcdef"}
	cl, err := natstest.Start(natstest.Options{Nodes: 1, Accounts: []natstest.Account{acme}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dir := t.TempDir()
	srvTLS, roots, err := tlstest.New()
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(srvTLS.Certificates[0].PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"cert.pem":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvTLS.Certificates[0].Certificate[0]}),
		"key.pem":      pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		"tenants.json": []byte(`[{"name":"acme","token":"` + acme.Token + `"}]`),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tenants := filepath.Join(dir, "tenants.json")
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"serve", "--listen", "0.0.0.0:0", "--tenants", tenants}, "not a loopback address"},
		{[]string{"serve", "--listen", "127.0.0.1:0"}, "--listen needs --tenants"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--tenants", tenants, "--tls-cert", "c.pem"}, "go together"},
	} {
		cmd := cloudcmd.Command()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keel cloud %s: %v, want an error saying %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr := runServe(t, ctx, []string{"--nats", cl.URL(), "--replicas", "1", "serve", "--workers", "1", "--tenants", tenants,
		"--listen", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem")})
	url := ""
	sc := bufio.NewScanner(pr)
	for url == "" && sc.Scan() {
		if _, u, ok := strings.Cut(sc.Text(), " on "); ok && strings.HasPrefix(u, "wss://") {
			url = u
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatalf("serve printed no wss:// URL")
	}
	c, err := client.DialTLS(ctx, url, acme.Token, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if runs, err := c.ListRuns(ctx, 10); err != nil || len(runs) != 0 {
		t.Errorf("run.list = %v, %v; want no runs", runs, err)
	}
	if _, err := client.DialTLS(ctx, url, "globex-0123456789abcdef", &tls.Config{RootCAs: roots}); err == nil {
		t.Errorf("dial %s with a token of no tenant: nil error, want a refusal", url)
	}
}

// runServe runs `keel cloud` with args until the test ends (its context
// cancelled, then its error checked) and returns what it prints.
func runServe(t *testing.T, ctx context.Context, args []string) io.Reader {
	t.Helper()
	sctx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	cmd := cloudcmd.Command()
	cmd.SetOut(pw)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	done := make(chan error, 1)
	go func() {
		done <- cmd.ExecuteContext(sctx)
		pw.Close()
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return pr
}
