// Package natstest runs embedded NATS JetStream servers on loopback for
// the tests and benchmarks of cloud/: a cluster of N nodes in this
// process, on random ports, with their stores in a temporary directory.
// A package shares one cluster between its tests (start it in TestMain)
// and keeps them apart by giving each its own namespace.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configures a Cluster. The zero value is a 3-node cluster with
// JetStream's default file-store sync (every 2 minutes).
type Options struct {
	// Nodes is how many servers; default 3. One node is not clustered.
	Nodes int
	// SyncAlways makes every node fsync each write before it acks it
	// (sync_interval: always); default false.
	SyncAlways bool
	// Dir holds the nodes' stores; default a new temporary directory,
	// removed by Close.
	Dir string
	// Accounts are NATS accounts of their own, each with JetStream and
	// one user: what a keel tenant is (docs/cloud.md). An account's
	// streams, buckets and subjects are a namespace of its own at the
	// server: a client of one can neither see nor name another's. With
	// accounts, a client that presents no user and password is the user
	// of account DefaultAccount, so that tests which know nothing of
	// tenants go on as before. Default none: one account, no
	// authentication.
	Accounts []Account
	// Domain is the JetStream domain of the cluster; default none. Leaf
	// nodes with JetStream of their own reach the cluster's JetStream
	// through it (cloud/edge uses "cloud").
	Domain string
	// LeafNodes makes every node accept leaf node connections on a
	// random loopback port (LeafURLs); default false. LeafUser and
	// LeafPassword, when set, are what a leaf node must present.
	LeafNodes              bool
	LeafUser, LeafPassword string
	// LeafUsers, instead of LeafUser, are users a leaf node may present,
	// each in an account and with permissions of its own; default none.
	// With them, clients that present no user are in DefaultAccount, as
	// with Accounts.
	LeafUsers []LeafUser
	// LeafNoAdvertise keeps the nodes from telling a leaf node the other
	// nodes' leaf URLs, so it redials only the URLs it was given (a test
	// that partitions a leaf with a relay); default false.
	LeafNoAdvertise bool
}

// LeafUser is a user a leaf node may present, in Account (an account of
// Options.Accounts; default DefaultAccount), to which its link then
// binds. Publish and Subscribe are the subjects a leaf node connected as
// the user may send into the cluster and receive from it (as the leaf
// sees them; nil: every subject).
type LeafUser struct {
	User, Password     string
	Account            string
	Publish, Subscribe []string
}

// Account is a NATS account with JetStream and one user, Name, whose
// password is Token.
type Account struct {
	Name  string
	Token string
}

// DefaultAccount is the account of clients that present no user when
// Options.Accounts is set.
const DefaultAccount = "keel"

// Cluster is a running set of embedded JetStream servers.
type Cluster struct {
	// Servers are the nodes; Restart replaces one.
	Servers   []*server.Server
	opts      []*server.Options // each node's, as it last started
	dir       string
	ownDir    bool
	leafPorts []int
}

// errNotStarted is a node that did not accept connections in time.
var errNotStarted = errors.New("did not start")

// Start starts a cluster and returns once its JetStream answers (a meta
// leader is elected), or an error after 30 s. A node that does not start
// is most often one whose port another process took between freePorts
// and the node's listening (a CI run of the whole suite met it): a
// cluster with a store of its own (no Options.Dir) is then started
// again, on other ports, twice at most.
func Start(o Options) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := start(o)
		if err == nil || o.Dir != "" || attempt == 3 || !errors.Is(err, errNotStarted) {
			return c, err
		}
	}
}

func start(o Options) (*Cluster, error) {
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	c := &Cluster{dir: o.Dir}
	if c.dir == "" {
		d, err := os.MkdirTemp("", "natstest-")
		if err != nil {
			return nil, err
		}
		c.dir, c.ownDir = d, true
	}
	// JetStream clustering wants every node's routes configured up front:
	// free ports are picked first (another process could take one before
	// its node listens; Start then fails and can be called again).
	ports, err := freePorts(o.Nodes)
	if err != nil {
		return nil, err
	}
	var leafPorts []int
	if o.LeafNodes {
		if leafPorts, err = freePorts(o.Nodes); err != nil {
			return nil, err
		}
		c.leafPorts = leafPorts
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	accounts, err := accountsConf(o.Accounts, len(o.LeafUsers) > 0)
	if err != nil {
		return nil, err
	}
	for i := range o.Nodes {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			NoSigs:     true,
			NoLog:      os.Getenv("NATSTEST_LOG") == "",
			JetStream:  true,
			StoreDir:   filepath.Join(c.dir, fmt.Sprintf("n%d", i+1)),
			SyncAlways: o.SyncAlways,
			// Small enough for many test clusters at once.
			JetStreamMaxMemory: 64 << 20,
			JetStreamMaxStore:  1 << 30,
			JetStreamDomain:    o.Domain,
		}
		if o.LeafNodes {
			opts.LeafNode = server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPorts[i], Username: o.LeafUser, Password: o.LeafPassword, NoAdvertise: o.LeafNoAdvertise}
		}
		if accounts != "" {
			// Each node its own accounts (a server's accounts are its own).
			var ao server.Options
			if err := ao.ProcessConfigString(accounts); err != nil {
				c.Close()
				return nil, fmt.Errorf("natstest: accounts: %w", err)
			}
			opts.Accounts, opts.Users, opts.NoAuthUser = ao.Accounts, ao.Users, ao.NoAuthUser
			// Leaf users are users of their account, with permissions: a
			// leaf port without users of its own authenticates a leaf
			// node as a client, and applies the user's permissions to
			// the link (nats-server's LeafNode.Users bind an account
			// only).
			for _, u := range o.LeafUsers {
				name := u.Account
				if name == "" {
					name = DefaultAccount
				}
				var acc *server.Account
				for _, a := range opts.Accounts {
					if a.Name == name {
						acc = a
					}
				}
				if acc == nil {
					c.Close()
					return nil, fmt.Errorf("natstest: leaf user %s: no account %q", u.User, name)
				}
				p := &server.Permissions{}
				if u.Publish != nil {
					p.Publish = &server.SubjectPermission{Allow: u.Publish}
				}
				if u.Subscribe != nil {
					p.Subscribe = &server.SubjectPermission{Allow: u.Subscribe}
				}
				opts.Users = append(opts.Users, &server.User{Username: u.User, Password: u.Password, Account: acc, Permissions: p})
			}
		}
		if o.Nodes > 1 {
			opts.Cluster = server.ClusterOpts{Name: "keel", Host: "127.0.0.1", Port: ports[i]}
			opts.Routes = routes
		}
		s, err := server.NewServer(opts)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("natstest: node %d: %w", i+1, err)
		}
		if !opts.NoLog {
			s.ConfigureLogger()
		}
		c.Servers = append(c.Servers, s)
		c.opts = append(c.opts, opts)
		s.Start()
		if !s.ReadyForConnections(30 * time.Second) {
			c.Close()
			return nil, fmt.Errorf("natstest: node %d %w within 30 s", i+1, errNotStarted)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.waitJetStream(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// accountsConf is the server configuration of accounts: each its own
// account with JetStream and one user, and DefaultAccount for clients
// that present no user.
func accountsConf(accounts []Account, users bool) (string, error) {
	if len(accounts) == 0 && !users {
		return "", nil
	}
	var b strings.Builder
	b.WriteString("accounts {\n")
	fmt.Fprintf(&b, "  %s: { jetstream: enabled, users: [{user: %q, password: %q}] }\n", DefaultAccount, DefaultAccount, DefaultAccount)
	for _, a := range accounts {
		if a.Name == "" || a.Name == DefaultAccount || a.Token == "" || !plain(a.Name) || !plain(a.Token) {
			return "", fmt.Errorf("natstest: account %q: a name other than %q and a token, both letters, digits, '-', '_' or '.'", a.Name, DefaultAccount)
		}
		fmt.Fprintf(&b, "  %s: { jetstream: enabled, users: [{user: %q, password: %q}] }\n", a.Name, a.Name, a.Token)
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "no_auth_user: %q\n", DefaultAccount)
	return b.String(), nil
}

// plain reports whether s is letters, digits, '-', '_' and '.': safe in
// the configuration unescaped.
func plain(s string) bool {
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == ""
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natstest: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// waitJetStream waits until every node's JetStream answers an account
// info request (the meta group has a leader).
func (c *Cluster) waitJetStream(ctx context.Context) error {
	for _, s := range c.Servers {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			return fmt.Errorf("natstest: %w", err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return fmt.Errorf("natstest: %w", err)
		}
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = js.AccountInfo(actx)
			cancel()
			if err == nil {
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				nc.Close()
				return fmt.Errorf("natstest: JetStream did not come up: %w", errors.Join(err, ctx.Err()))
			case <-t.C:
			}
		}
		nc.Close()
	}
	return nil
}

// URL returns the client URLs of every node, comma-separated, as
// nats.Connect takes them.
func (c *Cluster) URL() string {
	var us []string
	for _, s := range c.Servers {
		if s.Running() {
			us = append(us, s.ClientURL())
		}
	}
	return strings.Join(us, ",")
}

// LeafURLs returns the leaf node URLs of the running nodes (nats-leaf://
// 127.0.0.1:PORT), comma-separated; empty without Options.LeafNodes.
func (c *Cluster) LeafURLs() string {
	var us []string
	for i, s := range c.Servers {
		if s.Running() && i < len(c.leafPorts) {
			us = append(us, fmt.Sprintf("nats-leaf://127.0.0.1:%d", c.leafPorts[i]))
		}
	}
	return strings.Join(us, ",")
}

// Connect connects to the cluster (any node) with opts.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(c.URL(), opts...)
}

// ConnectAs connects as the user of account a (Options.Accounts).
func (c *Cluster) ConnectAs(a Account, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(c.URL(), append([]nats.Option{nats.UserInfo(a.Name, a.Token)}, opts...)...)
}

// Restart shuts node i down, if it runs, and starts it again with its
// store, its name and its ports (the client port it listened on), as a
// node restarted by its operator; it returns once the node accepts
// connections. Not safe for use beside other methods of the Cluster
// that read Servers (URL, Connect): call them before or after.
func (c *Cluster) Restart(i int) error {
	s := c.Servers[i]
	s.Shutdown()
	s.WaitForShutdown()
	opts := c.opts[i].Clone()
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("natstest: restart node %d: %w", i+1, err)
	}
	if !opts.NoLog {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return fmt.Errorf("natstest: node %d did not start again", i+1)
	}
	c.Servers[i], c.opts[i] = ns, opts
	return nil
}

// Close stops every node and removes the stores' directory if Start made
// it.
func (c *Cluster) Close() {
	// In parallel: a node's shutdown waits for its JetStream to stop.
	var wg sync.WaitGroup
	for _, s := range c.Servers {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	if c.ownDir {
		os.RemoveAll(c.dir)
	}
}
