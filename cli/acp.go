package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/acp"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func acpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "acp",
		Short: "Be an Agent Client Protocol agent on stdin/stdout for an editor (the daemon must run)",
		Long: `keel acp is an ACP (Agent Client Protocol) agent on stdin/stdout for editors
that start their agents as commands (Zed's agent_servers, JetBrains and
VS Code ACP clients). It connects to the running daemon of the data
directory: each session is a keel run (a prompt after the first forks the
session's last run with the prompt as its message), a tool call the
policy asks about becomes the editor's permission request, and a session
can be loaded again after the daemon restarted. Without a daemon it says
how to start one and exits 1. See docs/bridges.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client.DialDataDir(cmd.Context(), dataDir(cmd))
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Initialize(cmd.Context(), protocol.InitializeParams{Client: "keel-acp"}); err != nil {
				return err
			}
			runs := newDaemonRuns(c)
			// The connection's end (the daemon stopped) ends the agent.
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				runs.demux()
				cancel()
			}()
			agent, err := acp.New(acp.Config{Runs: runs, Version: versionLine(),
				Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				return err
			}
			err = agent.Serve(ctx, cmd.InOrStdin(), cmd.OutOrStdout())
			if cerr := c.Err(); cerr != nil && cmd.Context().Err() == nil {
				return fmt.Errorf("the connection to the daemon ended: %w", cerr)
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
}

// daemonRuns are the daemon's runs over keel's protocol, for keel acp.
type daemonRuns struct {
	c    *client.Client
	mu   sync.Mutex
	subs map[keel.RunID]*subscriber
	done bool
}

// subscriber is one run's subscription: its events, and gone, closed when
// it stops reading.
type subscriber struct {
	ch   chan keel.Event
	gone chan struct{}
}

func newDaemonRuns(c *client.Client) *daemonRuns {
	return &daemonRuns{c: c, subs: map[keel.RunID]*subscriber{}}
}

// demux hands each run.event to its run's subscriber until the
// connection ends, then closes every subscriber's channel.
func (d *daemonRuns) demux() {
	for ev := range d.c.Events() {
		d.mu.Lock()
		sub := d.subs[ev.RunID]
		d.mu.Unlock()
		if sub != nil {
			select {
			case sub.ch <- ev: // buffered; a turn reads its events until the run ends
			case <-sub.gone:
			}
		}
	}
	d.mu.Lock()
	d.done = true
	for id, sub := range d.subs {
		close(sub.ch)
		delete(d.subs, id)
	}
	d.mu.Unlock()
}

// sentinel maps the daemon's error codes to keel's sentinels.
func sentinel(err error) error {
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case protocol.CodeInvalidParams:
		return fmt.Errorf("%s: %w", pe.Message, keel.ErrInvalid)
	case protocol.CodeNotFound:
		return fmt.Errorf("%s: %w", pe.Message, keel.ErrNotFound)
	case protocol.CodeConflict:
		return fmt.Errorf("%s: %w", pe.Message, keel.ErrConflict)
	}
	return err
}

func (d *daemonRuns) Start(ctx context.Context, req keel.StartRequest) (keel.Run, error) {
	r, err := client.Do(ctx, d.c, client.RunStart, req)
	return r, sentinel(err)
}

func (d *daemonRuns) Fork(ctx context.Context, req keel.ForkRequest) (keel.Run, error) {
	r, err := client.Do(ctx, d.c, client.RunFork, req)
	return r, sentinel(err)
}

func (d *daemonRuns) Cancel(ctx context.Context, id keel.RunID) error {
	_, err := client.Do(ctx, d.c, client.RunCancel, protocol.RunRef{RunID: id})
	return sentinel(err)
}

func (d *daemonRuns) Approve(ctx context.Context, a acp.Approval) error {
	_, err := client.Do(ctx, d.c, client.RunApprove, protocol.RunApproveParams{RunID: a.Run, CallID: a.CallID,
		ArgsSHA256: a.ArgsSHA256, Approved: a.Approved, Reason: a.Reason})
	return sentinel(err)
}

func (d *daemonRuns) Get(ctx context.Context, id keel.RunID) (acp.Detail, error) {
	r, err := client.Do(ctx, d.c, client.RunGet, protocol.RunRef{RunID: id})
	return acp.Detail{Run: r.Run, Events: r.Events, Spans: r.Spans}, sentinel(err)
}

func (d *daemonRuns) Tools(ctx context.Context) ([]keel.ToolSpec, error) {
	tools, err := d.c.ListTools(ctx)
	if err != nil {
		return nil, sentinel(err)
	}
	specs := make([]keel.ToolSpec, len(tools))
	for i, t := range tools {
		specs[i] = t.ToolSpec
	}
	return specs, nil
}

func (d *daemonRuns) List(ctx context.Context, q keel.RunQuery) (keel.RunPage, error) {
	r, err := client.Do(ctx, d.c, client.RunList, q)
	return r, sentinel(err)
}

// subscriberBuffer is the capacity of a subscriber's channel: the events
// of a turn are read as they come.
const subscriberBuffer = 1024

func (d *daemonRuns) Subscribe(ctx context.Context, id keel.RunID, afterSeq int64) (<-chan keel.Event, func(), error) {
	sub := &subscriber{ch: make(chan keel.Event, subscriberBuffer), gone: make(chan struct{})}
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return nil, nil, client.ErrClosed
	}
	if d.subs[id] != nil {
		d.mu.Unlock()
		return nil, nil, fmt.Errorf("run %s: already subscribed: %w", id, keel.ErrConflict)
	}
	d.subs[id] = sub
	d.mu.Unlock()
	var once sync.Once
	stop := func() {
		once.Do(func() { close(sub.gone) })
		d.mu.Lock()
		if d.subs[id] == sub {
			delete(d.subs, id)
		}
		d.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = client.Do(ctx, d.c, client.RunUnsubscribe, protocol.RunRef{RunID: id})
	}
	if _, err := client.Do(ctx, d.c, client.RunSubscribe, protocol.SubscribeParams{RunID: id, AfterSeq: afterSeq}); err != nil {
		stop()
		return nil, nil, sentinel(err)
	}
	return sub.ch, stop, nil
}
