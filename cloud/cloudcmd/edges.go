package cloudcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// declareCloud publishes the cloud's declaration (the workers' models
// and tools) in the edges bucket of ns every ttl/3 until ctx ends.
func declareCloud(ctx context.Context, js jetstream.JetStream, ns string, model models.Provider, tools []keel.ToolSpec, ttl time.Duration, log *slog.Logger) {
	kv, err := js.KeyValue(ctx, edge.BucketName(ns))
	if err != nil {
		log.Error("cloud declaration", logkey.Err, err)
		return
	}
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		env := route.Env{Name: edge.CloudName, Kind: route.KindCloud, Version: keel.Version, At: time.Now().UTC()}
		for _, s := range tools {
			env.Tools = append(env.Tools, route.Tool{Name: s.Name, SideEffects: string(s.SideEffects)})
		}
		if ms, err := model.Models(ctx); err == nil {
			for _, m := range ms {
				env.Models = append(env.Models, route.Model{Name: m.Name, ContextLength: m.ContextLength})
			}
		}
		if b, err := json.Marshal(env); err == nil {
			if _, err := kv.Put(ctx, edge.CloudName, b); err != nil && ctx.Err() == nil {
				log.Warn("cloud declaration", logkey.Err, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// printWorkers writes the workers alive, as of now.
func printWorkers(w io.Writer, ws []cloud.WorkerInfo, now time.Time) {
	fmt.Fprintf(w, "workers    %d\n", len(ws))
	for _, wi := range ws {
		fmt.Fprintf(w, "  %s  runs %d/%d  leases %d  heartbeat %s ago  up %s\n", wi.Name, wi.Runs, wi.MaxRuns, wi.Leases,
			now.Sub(wi.At).Round(time.Millisecond), now.Sub(wi.Started).Round(time.Second))
	}
}

// printEdges writes the edges and their declared capabilities.
func printEdges(w io.Writer, envs []route.Env) {
	n := 0
	for _, e := range envs {
		if e.Kind == route.KindEdge {
			n++
		}
	}
	fmt.Fprintf(w, "edges      %d\n", n)
	for _, e := range envs {
		var tools, ms []string
		for _, t := range e.Tools {
			tools = append(tools, t.Name)
		}
		for _, m := range e.Models {
			ms = append(ms, m.Name)
		}
		age := ""
		if !e.At.IsZero() {
			age = fmt.Sprintf(" (seen %s ago)", time.Since(e.At).Round(time.Second))
		}
		fmt.Fprintf(w, "  %s %s%s\n    tools:  %s\n    models: %s\n    labels: %s\n    load:   %d\n", e.Kind, e.Name, age,
			orNone(tools), orNone(ms), orNone(e.Labels), e.Load)
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}

// stepCmd is `keel cloud step`: route a step by what it needs, hand it to
// the edge chosen, and print how it ended.
func stepCmd(c *conn) *cobra.Command {
	var (
		id, model, origin string
		tools, labels     []string
		minContext        int
		timeout           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "step GOAL",
		Short: "Route a step to the environment that declares what it needs, and wait for it",
		Long: `Route a step to the environment (an edge or the cloud) that declares what
it needs: --tool, --model, --min-context, and the labels of its inputs
(--label; private inputs stay at --origin). A step for an edge is handed
off and followed in the edge's mirror until it ends; the result shown is
what crossed back. A step for the cloud is queued (keel cloud submit).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			nc, js, err := c.connect("keel-cloud-step")
			if err != nil {
				return err
			}
			defer nc.Close()
			envs, err := edge.ReadEdges(ctx, js, c.ns)
			if err != nil {
				return err
			}
			need := route.Need{Tools: tools, Model: model, MinContext: minContext, Labels: labels, Origin: origin}
			dec, err := route.Decide(need, envs)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "routed to %s %s: %s\n", dec.Kind, dec.Env, dec.Reason)
			if id == "" {
				id = fmt.Sprintf("step-%d", time.Now().UnixNano())
			}
			if dec.Kind == route.KindCloud {
				if err := submit(ctx, js, c, keel.StartRequest{Goal: args[0], Model: model, IdempotencyKey: id}); err != nil {
					return err
				}
				fmt.Fprintf(w, "queued as %s\n", id)
				return nil
			}
			if err := edge.Setup(ctx, js, c.ns, c.replicas, 0); err != nil {
				return err
			}
			done, err := edge.Handoff(ctx, nc, js, c.ns, dec, edge.Step{ID: id, Goal: args[0], Model: model, Tools: toolsOrNil(tools), Need: need})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "run %s on %s: %s\n", done.RunID, done.Edge, done.Status)
			if done.Withheld {
				fmt.Fprintln(w, "result withheld: its labels may not leave the edge")
			} else if done.Result != "" {
				fmt.Fprintln(w, done.Result)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "the step's ID (a repeated hand-off of one ID runs once; default: a new one)")
	f.StringSliceVar(&tools, "tool", nil, "a tool the step needs (repeatable)")
	f.StringVar(&model, "model", "", "the model the step needs")
	f.IntVar(&minContext, "min-context", 0, "the least context length the step's model needs")
	f.StringSliceVar(&labels, "label", nil, "a label of the step's inputs (repeatable; private: they stay at --origin)")
	f.StringVar(&origin, "origin", "", "the edge the step's inputs come from")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the step")
	return cmd
}

func toolsOrNil(t []string) []string {
	if len(t) == 0 {
		return nil
	}
	return t
}

// serveEdges sets up the edges bucket and hand-off stream, and declares
// the cloud (its model's models, its tools) there until ctx ends or the
// returned stop is called, which waits for it.
func serveEdges(ctx context.Context, c *conn, model models.Provider, tools interface {
	Specs(context.Context) []keel.ToolSpec
}, log *slog.Logger) (stop func(), err error) {
	nc, js, err := c.connect("keel-cloud-edges")
	if err != nil {
		return nil, err
	}
	if err := edge.Setup(ctx, js, c.ns, c.replicas, 0); err != nil {
		nc.Close()
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer nc.Close()
		declareCloud(dctx, js, c.ns, model, tools.Specs(dctx), edge.DefaultTTL, log)
	}()
	return func() { cancel(); <-done }, nil
}

// submit queues a run for the workers.
func submit(ctx context.Context, js jetstream.JetStream, c *conn, req keel.StartRequest) error {
	if err := cloud.Setup(ctx, js, c.ns, c.replicas, 0); err != nil {
		return err
	}
	return cloud.Submit(ctx, js, c.ns, req)
}
