package edge

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRemoteOpts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	jwt := write("u.creds", "-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
	tests := []struct {
		name, urls, creds string
		wantUser, wantPW  string
		wantCreds         string
		wantURLs          int
		wantErr           bool
	}{
		{name: "no credentials", urls: "nats-leaf://a:7422,nats-leaf://b:7422", wantURLs: 2},
		{name: "user and password", urls: "nats-leaf://a:7422", creds: write("up", "edge:pw\n"), wantUser: "edge", wantPW: "pw", wantURLs: 1},
		{name: "token", urls: "nats-leaf://a:7422", creds: write("tok", "t0ken\n"), wantUser: "t0ken", wantURLs: 1},
		{name: "a NATS credentials file", urls: "nats-leaf://a:7422", creds: jwt, wantCreds: jwt, wantURLs: 1},
		{name: "empty file", urls: "nats-leaf://a:7422", creds: write("empty", "\n"), wantErr: true},
		{name: "missing file", urls: "nats-leaf://a:7422", creds: filepath.Join(dir, "nope"), wantErr: true},
		{name: "not a URL", urls: "a:b:c", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := remoteOpts(tc.urls, tc.creds)
			if tc.wantErr {
				if err == nil {
					t.Errorf("remoteOpts(%q, %q) = %+v, want an error", tc.urls, tc.creds, r)
				}
				return
			}
			if err != nil {
				t.Fatalf("remoteOpts(%q, %q): %v", tc.urls, tc.creds, err)
			}
			if len(r.URLs) != tc.wantURLs || r.Credentials != tc.wantCreds {
				t.Errorf("remoteOpts = %d URLs, credentials %q; want %d, %q", len(r.URLs), r.Credentials, tc.wantURLs, tc.wantCreds)
			}
			u := r.URLs[0].User
			var user, pw string
			if u != nil {
				user = u.Username()
				pw, _ = u.Password()
			}
			if user != tc.wantUser || pw != tc.wantPW {
				t.Errorf("remoteOpts user = %q:%q, want %q:%q", user, pw, tc.wantUser, tc.wantPW)
			}
		})
	}
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"laptop", "edge-1", "a_b"} {
		if err := checkName(n); err != nil {
			t.Errorf("checkName(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range []string{"", "Laptop", "a.b", "a b", "cloud", "x>"} {
		if err := checkName(n); err == nil {
			t.Errorf("checkName(%q) = nil, want an error", n)
		}
	}
	if got := cleanName("My-Mac.local"); got != "my-mac" {
		t.Errorf("cleanName(My-Mac.local) = %q, want my-mac", got)
	}
}
