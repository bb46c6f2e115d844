package cloudcmd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/gateway"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

// listenFlags are serve's flags of the WebSocket endpoint.
type listenFlags struct {
	addr             string
	tlsCert, tlsKey  string
	allowHosts       []string
	allowNonLoopback bool
}

func (l *listenFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&l.addr, "listen", "", "serve keel/1 over WebSocket to the tenants' clients on this HOST:PORT (needs --tenants); none if empty")
	f.StringVar(&l.tlsCert, "tls-cert", "", "PEM certificate (chain) of --listen: clients connect with wss://")
	f.StringVar(&l.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringSliceVar(&l.allowHosts, "allow-host", nil, "a Host name (NAME or NAME:PORT) clients reach --listen by, beside the loopback names; repeatable")
}

// check refuses what --listen cannot serve, before any slow work.
func (l *listenFlags) check(tenants string) error {
	if l.addr == "" {
		if l.tlsCert != "" || l.tlsKey != "" || len(l.allowHosts) > 0 {
			return errors.New("--tls-cert, --tls-key and --allow-host go with --listen")
		}
		return nil
	}
	if tenants == "" {
		return errors.New("--listen needs --tenants: each tenant's clients authenticate with its token")
	}
	if (l.tlsCert == "") != (l.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	// Tokens cross the network in the clear without TLS: a listener that
	// other machines reach needs it.
	if err := ipc.CheckAddr(l.addr, l.tlsCert != ""); err != nil {
		return fmt.Errorf("%w (with --tls-cert and --tls-key it may)", err)
	}
	return nil
}

// serve serves keel/1 on --listen for ts, each through a
// connection of its own as the tenant, until ctx is done; wait waits for
// it to stop.
func (l *listenFlags) serve(ctx context.Context, c *conn, ts []cloud.Tenant, tools gateway.ToolSpecs, model gateway.ModelLister, out io.Writer, log *slog.Logger) (wait func() error, err error) {
	var gts []gateway.Tenant
	closeAll := func() {
		for _, t := range gts {
			t.Conn.Close()
		}
	}
	for _, t := range ts {
		nc, _, err := c.connectAs("gateway-"+t.Name, t.Name, t.Token)
		if err != nil {
			closeAll()
			return nil, err
		}
		gts = append(gts, gateway.Tenant{Name: t.Name, Token: t.Token, Conn: nc, Tools: tools, Models: model, Limits: t.Limits})
	}
	g, err := gateway.New(ctx, gateway.Config{Namespace: c.ns, Replicas: c.replicas, Tenants: gts, AllowedHosts: l.allowHosts, Logger: log})
	if err != nil {
		closeAll()
		return nil, err
	}
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		closeAll()
		return nil, err
	}
	scheme := "ws"
	if l.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(l.tlsCert, l.tlsKey)
		if err != nil {
			ln.Close()
			closeAll()
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		scheme = "wss"
	}
	fmt.Fprintf(out, "keel/1 for %d tenants on %s://%s%s\n", len(ts), scheme, ln.Addr(), protocol.Path)
	var runErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		runErr = g.Run(ctx, ln)
		closeAll()
	})
	return func() error {
		wg.Wait()
		return runErr
	}, nil
}
