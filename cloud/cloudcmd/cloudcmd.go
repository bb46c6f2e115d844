// Package cloudcmd is `keel cloud`, the cloud side's composition root: it
// connects to a NATS JetStream cluster (or starts one in this process for
// a trial on one machine), and builds the workers' engines with their
// tools (a wasmtools directory) and model (Ollama). cmd/keel adds its
// command to the CLI; nothing else imports it.
package cloudcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// Command returns `keel cloud` and its subcommands: serve, submit, status.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cloud",
		Short: "Run keel's engine as workers over a NATS JetStream cluster (preview)",
		Long: `Run keel's engine as a fleet of workers over a NATS JetStream cluster.

Runs, their journals, spans and leases live in JetStream; a worker that dies
has its runs adopted by another from the journal. See docs/cloud.md for the
design, the durability given and what is not built yet.`,
	}
	var c conn
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.url, "nats", nats.DefaultURL, "NATS server URL(s), comma-separated (tls://host:port for TLS)")
	pf.StringVar(&c.ns, "namespace", "keel", "namespace of the fleet's streams and buckets")
	pf.IntVar(&c.replicas, "replicas", 3, "replicas of the streams and buckets created (1 or 3)")
	pf.StringVar(&c.tenant, "tenant", "", "tenant (NATS account user) to connect as; none: no authentication")
	pf.StringVar(&c.token, "token", "", "the tenant's token (default: $KEEL_CLOUD_TOKEN)")
	pf.StringVar(&c.tlsCA, "tls-ca", "", "PEM file of the CA that signed the servers' TLS certificates (default: the system's)")
	cmd.AddCommand(serveCmd(&c), submitCmd(&c), statusCmd(&c), stepCmd(&c))
	return cmd
}

// conn is the flags every subcommand shares.
type conn struct {
	url      string
	ns       string
	replicas int
	tenant   string
	token    string
	tlsCA    string
}

// connect connects as --tenant (or none).
func (c *conn) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	token := c.token
	if token == "" {
		token = os.Getenv("KEEL_CLOUD_TOKEN")
	}
	if c.tenant != "" && token == "" {
		return nil, nil, errors.New("--tenant needs --token or KEEL_CLOUD_TOKEN")
	}
	return c.connectAs(name, c.tenant, token)
}

// connectAs connects as user tenant with password token (none if
// tenant is empty).
func (c *conn) connectAs(name, tenant, token string) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{nats.Name(name)}
	if tenant != "" {
		opts = append(opts, nats.UserInfo(tenant, token))
	}
	if c.tlsCA != "" {
		opts = append(opts, nats.RootCAs(c.tlsCA))
	}
	nc, err := nats.Connect(c.url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", c.url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func serveCmd(c *conn) *cobra.Command {
	var (
		workers, maxRuns, embedded          int
		tools, dataDir, ollamaHost, tenants string
		lease                               time.Duration
		listen                              listenFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run N workers until interrupted",
		Long: `Run N workers of the engine, each with its own connection, until interrupted.

With --embedded N, start an N-node JetStream cluster in this process first
(its stores under --data-dir), on loopback: a trial on one machine.

With --listen ADDR (and --tenants), serve keel/1 over WebSocket to the
tenants' clients, each with its tenant's token (--tls-cert and --tls-key for
wss://, required off loopback; --allow-host for the names clients use).

With --tenants FILE, serve each tenant of the file (a JSON array of
{"name", "token", "limits": {"budget_tokens", "budget_usd", "total_tokens", "total_usd", "tools"},
"require_approval", "edges": [{"name", "password"}]}) with workers of its own, connected as the tenant's
NATS user: each tenant is a NATS account of its own (the embedded cluster
is configured so; an external one must be, see docs/cloud.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if err := listen.check(tenants); err != nil {
				return err
			}
			ts := []cloud.Tenant{{}} // none: one fleet, no authentication
			if tenants != "" {
				var err error
				if ts, err = cloud.ReadTenants(tenants); err != nil {
					return err
				}
			}
			if embedded > 0 {
				if dataDir == "" {
					return errors.New("--embedded needs --data-dir for the cluster's stores")
				}
				var accounts []natstest.Account
				var edgeUsers []natstest.LeafUser
				for _, t := range ts {
					if t.Name != "" {
						accounts = append(accounts, natstest.Account{Name: t.Name, Token: t.Token})
					}
					// A tenant's edges are users of its account, each
					// allowed its own names only.
					for _, e := range t.Edges {
						pub, sub := edge.Permissions(c.ns, e.Name, edge.DefaultDomain)
						edgeUsers = append(edgeUsers, natstest.LeafUser{User: e.Name, Password: e.Password, Account: t.Name, Publish: pub, Subscribe: sub})
					}
				}
				cl, err := natstest.Start(natstest.Options{Nodes: embedded, Dir: filepath.Join(dataDir, "nats"), Accounts: accounts,
					// Edges join as leaf nodes (docs/cloud.md, "Edges").
					Domain: edge.DefaultDomain, LeafNodes: true, LeafUsers: edgeUsers})
				if err != nil {
					return err
				}
				defer cl.Close()
				c.url = cl.URL()
				if embedded < 3 {
					c.replicas = 1
				}
				fmt.Fprintf(cmd.OutOrStdout(), "embedded cluster of %d: %s\nedges join at: %s\n", embedded, c.url, cl.LeafURLs())
			}
			local, err := ollama.New(ollama.Config{Host: ollamaHost})
			if err != nil {
				return err
			}
			// Through the model layer's router, which keeps each run's
			// budget (a tenant's limits and its share of its total).
			model, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: local}}})
			if err != nil {
				return err
			}
			var rt engine.Tools = noTools{}
			if tools != "" {
				reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: tools, Logger: log})
				if err != nil {
					return err
				}
				defer reg.Close(context.WithoutCancel(ctx))
				rt = reg.RunTools()
			}
			var ws []*cloud.Worker
			defer func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				for _, w := range ws {
					w.Close(cctx)
				}
			}()
			for _, t := range ts {
				for i := range workers {
					name := fmt.Sprintf("%s-%d", hostname(), i+1)
					if t.Name != "" {
						name = t.Name + "-" + name
					}
					nc, _, err := c.connectAs(name, t.Name, t.Token)
					if err != nil {
						return err
					}
					w, err := cloud.Start(ctx, nc, cloud.Config{Namespace: c.ns, Replicas: c.replicas, Name: name, MaxRuns: maxRuns, LeaseTTL: lease,
						Limits: t.Limits, Logger: log,
						NewEngine: func(st engine.Store) (*engine.Engine, error) {
							return engine.New(engine.Config{Store: st, Model: model, Tools: rt, RequireApproval: t.RequireApproval, Logger: log.With(logkey.Worker, name)})
						}})
					if err != nil {
						nc.Close()
						return err
					}
					ws = append(ws, w)
				}
			}
			stopEdges, err := serveEdges(ctx, c, model, rt, log)
			if err != nil {
				return err
			}
			defer stopEdges()
			// A tenant's edges declare themselves and are mirrored in its
			// account: its edges bucket and hand-off stream are there.
			for _, t := range ts {
				if len(t.Edges) == 0 {
					continue
				}
				nc, js, err := c.connectAs("keel-cloud-edges-"+t.Name, t.Name, t.Token)
				if err != nil {
					return err
				}
				err = edge.Setup(ctx, js, c.ns, c.replicas, 0)
				nc.Close()
				if err != nil {
					return fmt.Errorf("tenant %s: %w", t.Name, err)
				}
			}
			if tenants != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "%d workers for each of %d tenants serving namespace %s\n", workers, len(ts), c.ns)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%d workers serving namespace %s\n", workers, c.ns)
			}
			if listen.addr != "" {
				wait, err := listen.serve(ctx, c, ts, rt, model, cmd.OutOrStdout(), log)
				if err != nil {
					return err
				}
				defer wait()
			}
			<-ctx.Done()
			return nil
		},
	}
	listen.add(cmd)
	f := cmd.Flags()
	f.IntVar(&workers, "workers", 3, "workers to run")
	f.IntVar(&maxRuns, "max-runs", 4, "runs each worker runs at once")
	f.IntVar(&embedded, "embedded", 0, "start an embedded cluster of this many nodes (0: connect to --nats)")
	f.StringVar(&dataDir, "data-dir", "", "directory of the embedded cluster's stores")
	f.StringVar(&tools, "tools", "", "directory of WebAssembly tools (NAME.wasm with NAME.manifest.json); none if empty")
	f.StringVar(&ollamaHost, "ollama", "", "Ollama's address (default: OLLAMA_HOST, else 127.0.0.1:11434)")
	f.DurationVar(&lease, "lease", 30*time.Second, "lease time to live: a dead worker's runs are adopted after about this long")
	f.StringVar(&tenants, "tenants", "", "JSON file of the tenants to serve, each a NATS account (see docs/cloud.md); none: one fleet, no authentication")
	return cmd
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "worker"
	}
	return h
}

// noTools is a worker's tools when --tools is not given.
type noTools struct{}

func (noTools) Specs(context.Context) []keel.ToolSpec { return nil }
func (noTools) Call(_ context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	return nil, &keel.ToolError{Code: keel.ToolNotFound, Message: "no tool " + inv.Name}
}

func submitCmd(c *conn) *cobra.Command {
	var key, model string
	var maxSteps int
	cmd := &cobra.Command{
		Use:   "submit GOAL",
		Short: "Queue a run for the fleet",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			nc, js, err := c.connect("keel-cloud-submit")
			if err != nil {
				return err
			}
			defer nc.Close()
			if err := cloud.Setup(ctx, js, c.ns, c.replicas, 0); err != nil {
				return err
			}
			if key == "" {
				key = fmt.Sprintf("submit-%d", time.Now().UnixNano())
			}
			if err := cloud.Submit(ctx, js, c.ns, keel.StartRequest{Goal: args[0], Model: model, MaxSteps: maxSteps, IdempotencyKey: key}); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), key)
			return nil
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "idempotency key naming the run (default: a new one)")
	cmd.Flags().StringVar(&model, "model", "", "model of the run")
	cmd.Flags().IntVar(&maxSteps, "max-steps", 0, "step limit (0: the engine's default)")
	return cmd
}

// Status is what `keel cloud status` reports.
type Status struct {
	Queued   uint64                 // work items not yet delivered to a worker
	InFlight int                    // work items a worker holds
	Leases   int                    // runs a worker holds a lease on
	Runs     map[keel.RunStatus]int // runs not ended, by status
	// Workers are the workers alive (a heartbeat within a lease TTL),
	// each with its runs and the leases it holds.
	Workers []cloud.WorkerInfo
	// Edges are the environments declared now: the edges connected, and
	// the cloud's own, with what each declares.
	Edges []route.Env
}

// ReadStatus reads the fleet's status in namespace ns (creating its
// streams with replicas if there are none yet).
func ReadStatus(ctx context.Context, js jetstream.JetStream, ns string, replicas int) (Status, error) {
	st := Status{Runs: map[keel.RunStatus]int{}}
	// No queue yet (nothing submitted, no worker started): nothing queued.
	cons, err := js.Consumer(ctx, ns+"_WORK", "workers")
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return st, fmt.Errorf("work queue: %w", err)
	default:
		info, err := cons.Info(ctx)
		if err != nil {
			return st, fmt.Errorf("work queue: %w", err)
		}
		st.Queued, st.InFlight = info.NumPending, info.NumAckPending
	}
	kv, err := js.KeyValue(ctx, ns+"_leases")
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return st, fmt.Errorf("leases: %w", err)
	default:
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return st, fmt.Errorf("leases: %w", err)
		}
		for range keys.Keys() {
			st.Leases++
		}
	}
	store, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: ns, Replicas: replicas})
	if err != nil {
		return st, err
	}
	defer store.Close()
	runs, err := store.RunsWithStatus(ctx, keel.RunQueued, keel.RunRunning, keel.RunWaiting, keel.RunPaused, keel.RunInterrupted)
	if err != nil {
		return st, err
	}
	for _, r := range runs {
		st.Runs[r.Status]++
	}
	if st.Workers, err = cloud.ReadWorkers(ctx, js, ns); err != nil {
		return st, err
	}
	if st.Edges, err = edge.ReadEdges(ctx, js, ns); err != nil {
		return st, fmt.Errorf("edges: %w", err)
	}
	return st, nil
}

func statusCmd(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the fleet's queue, leases, runs in flight, workers and edges",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := c.connect("keel-cloud-status")
			if err != nil {
				return err
			}
			defer nc.Close()
			st, err := ReadStatus(cmd.Context(), js, c.ns, c.replicas)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "queued     %d\nin flight  %d\nleases     %d\n", st.Queued, st.InFlight, st.Leases)
			for _, s := range []keel.RunStatus{keel.RunQueued, keel.RunRunning, keel.RunWaiting, keel.RunPaused, keel.RunInterrupted} {
				fmt.Fprintf(w, "runs %-11s %d\n", s, st.Runs[s])
			}
			printWorkers(w, st.Workers, time.Now())
			printEdges(w, st.Edges)
			return nil
		},
	}
}
