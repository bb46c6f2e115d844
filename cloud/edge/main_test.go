package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/models"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The cloud every test of the package shares: a 3-node JetStream cluster
// in domain "cloud", taking leaf nodes that present leafUser:leafPass.
// Tests keep apart by their edges' names.
var (
	cluster  *natstest.Cluster
	storeDir string
	nc       *nats.Conn
	js       jetstream.JetStream
)

const (
	ns                 = "keel"
	leafUser, leafPass = "edge", "s3cret-edge"
	// ttl is how long the cloud keeps a silent edge's declaration: 40
	// heartbeats, so that a loaded machine's stall does not make an edge
	// disappear.
	ttl = 4 * time.Second
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if storeDir, err = os.MkdirTemp("", "edge-cloud-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(storeDir)
	cluster, err = natstest.Start(natstest.Options{Dir: storeDir, Domain: edge.DefaultDomain, LeafNodes: true, LeafUser: leafUser, LeafPassword: leafPass,
		// TestPartition's relay is the edge's only way to the cloud.
		LeafNoAdvertise: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cluster.Close()
	if nc, err = cluster.Connect(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// What keel cloud serve sets up: the workers' queue and streams, the
	// edges' bucket and hand-off stream.
	if err := cloud.Setup(ctx, js, ns, 3, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := edge.Setup(ctx, js, ns, 3, ttl); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// credentials writes a credentials file for the cloud's leaf port.
func credentials(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cloud.creds")
	if err := os.WriteFile(f, []byte(leafUser+":"+leafPass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// joined starts a real daemon joined to the cloud at url as edge name,
// answering its runs' model calls with provider.
func joined(t *testing.T, name, url string, provider models.Provider) *daemontest.Daemon {
	t.Helper()
	return daemontest.Start(t, daemon.Config{Provider: provider, Join: url, JoinCredentials: credentials(t), EdgeName: name,
		EdgeHeartbeat: 100 * time.Millisecond})
}

// joinedUp is joined, once the cloud holds the edge's declaration
// (waitEdge), with a client of the daemon.
func joinedUp(t *testing.T, name, url string, provider models.Provider) (*daemontest.Daemon, *client.Client) {
	t.Helper()
	d := joined(t, name, url, provider)
	waitEdge(t, name, true)
	return d, daemontest.Dial(t, d.Dir)
}

// waitEdge waits until the edges bucket holds name's declaration
// (present) or no longer does, and returns the declaration seen.
func waitEdge(t *testing.T, name string, present bool) route.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, edge.BucketName(ns))
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var last jetstream.KeyValueEntry
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				if !present && last == nil {
					return route.Env{}
				}
				continue
			}
			last = e
			if e.Operation() == jetstream.KeyValuePut {
				if present {
					var d route.Env
					if err := json.Unmarshal(e.Value(), &d); err != nil {
						t.Fatal(err)
					}
					return d
				}
			} else if !present {
				return route.Env{}
			}
		case <-ctx.Done():
			t.Fatalf("edge %s: present=%v not seen within a minute (last entry %v)", name, present, last)
		}
	}
}

// mirrored reads the events of run in edge's mirror up to and including
// the one of seq upTo (0: until the run ends).
func mirrored(t *testing.T, edgeName string, run keel.RunID, upTo int64) []keel.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var evs []keel.Event
	err := edge.Follow(ctx, js, ns, edgeName, run, func(ev keel.Event) bool {
		evs = append(evs, ev)
		if upTo > 0 {
			return ev.Seq < upTo
		}
		return ev.Type != keel.EventRunSucceeded && ev.Type != keel.EventRunFailed && ev.Type != keel.EventRunCancelled
	})
	if err != nil {
		t.Fatalf("mirror of %s, run %s: %v; got %v", edgeName, run, err, daemontest.Types(evs))
	}
	return evs
}

// proxy is a TCP relay to a target that a test can cut (every
// connection closed, new ones refused) and restore: a partition.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		relay := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		p.wg.Go(func() { relay(up, c) })
		p.wg.Go(func() { relay(c, up) })
	}
}

// Cut closes every relayed connection and refuses new ones.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Restore lets connections through again.
func (p *proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
