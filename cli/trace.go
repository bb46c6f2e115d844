package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/waterfall"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// traceOptions are keel trace's flags.
type traceOptions struct {
	follow bool
	asJSON bool
	width  int // 0: COLUMNS, else the terminal's, else waterfall.DefaultWidth
	depth  int // how deep sub-agent runs nest
}

// defaultTraceDepth is how many levels of sub-agent runs keel trace
// fetches by default.
const defaultTraceDepth = 8

// maxTraceRuns bounds the runs (the run and its sub-agents, all levels)
// one waterfall fetches.
const maxTraceRuns = 1000

func traceCmd() *cobra.Command {
	var o traceOptions
	cmd := &cobra.Command{
		Use:   "trace RUN",
		Short: "Show a run's trace as a waterfall: start offsets, durations as bars, tokens, cost, status, the critical path marked; sub-agent runs nested; --follow for a live run",
		Long: `Show a run's trace as a waterfall, one line per span, indented under its
parent: its start from the run's start, its duration, a bar on the
run's time scale, tokens in/out, cost and status. Marks, readable
without colour: '*' the critical path (from the root, the child that
ends last, down to a leaf), '!' a span that failed; a running span's bar
is open to now and ends in '>'. A plan or DAG run's sub-agent runs are
nested under the steps they carry out, --depth levels deep.

--follow redraws the waterfall on each event of the run (and of its
sub-agents) until the run ends, then prints the final one and exits with
the run's code, as 'keel attach' does; Ctrl-C stops following (the run
goes on). When stdout is not a terminal, --follow prints only the final
waterfall. --json prints the tree: each span with its offset_ns,
duration_ns, critical flag and children.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.width < 0 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--width %d: want a number of columns", o.width)}
			}
			if o.depth < 0 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--depth %d: want 0 or more levels", o.depth)}
			}
			id := keel.RunID(args[0])
			return withClient(cmd, func(c *client.Client) error {
				if o.follow {
					return followTrace(cmd, c, id, o)
				}
				tr, err := fetchTrace(cmd.Context(), c, id, o.depth)
				if err != nil {
					return err
				}
				return printTrace(cmd.OutOrStdout(), tr, o, time.Now())
			})
		},
	}
	cmd.Flags().BoolVarP(&o.follow, "follow", "f", false, "redraw on each event of a live run until it ends")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print the tree as JSON")
	cmd.Flags().IntVar(&o.width, "width", 0, "line width in columns (default: $COLUMNS, else the terminal's, else "+strconv.Itoa(waterfall.DefaultWidth)+")")
	cmd.Flags().IntVar(&o.depth, "depth", defaultTraceDepth, "levels of sub-agent runs to nest (0: the run alone)")
	return cmd
}

// runTrace is a run's spans with those of its sub-agents, as far as they
// were fetched.
type runTrace struct {
	run   keel.Run
	spans []keel.Span
	// runs are the runs whose spans are in: the run and its sub-agents,
	// with the seq of the last event fetched (0: none), to subscribe
	// from.
	runs map[keel.RunID]fetchedRun
	// unfetched counts the sub-agent runs left out: past --depth, past
	// maxTraceRuns, or not found (not started yet, or deleted).
	unfetched int
}

type fetchedRun struct {
	status  keel.RunStatus
	lastSeq int64
}

// fetchTrace gets run id's spans and, breadth first down to depth
// levels, those of the sub-agent runs its plan steps name (a sub-agent's
// root span names the step span as parent, so its trace hangs there).
func fetchTrace(ctx context.Context, c *client.Client, id keel.RunID, depth int) (*runTrace, error) {
	det, err := c.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	tr := &runTrace{run: det.Run, spans: det.Spans, runs: map[keel.RunID]fetchedRun{id: fetched(det)}}
	type level struct {
		spans []keel.Span
		depth int
	}
	queue := []level{{det.Spans, 0}}
	for len(queue) > 0 {
		l := queue[0]
		queue = queue[1:]
		for _, s := range l.spans {
			child, ok := waterfall.SubRun(s)
			if !ok {
				continue
			}
			if _, have := tr.runs[child]; have {
				continue
			}
			if l.depth >= depth || len(tr.runs) >= maxTraceRuns {
				tr.unfetched++
				continue
			}
			cd, err := c.GetRun(ctx, child)
			var pe *protocol.Error
			if errors.As(err, &pe) && pe.Code == protocol.CodeNotFound {
				tr.unfetched++
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("sub-agent run %s: %w", child, err)
			}
			tr.runs[child] = fetched(cd)
			tr.spans = append(tr.spans, cd.Spans...)
			queue = append(queue, level{cd.Spans, l.depth + 1})
		}
	}
	return tr, nil
}

func fetched(d protocol.RunDetail) fetchedRun {
	f := fetchedRun{status: d.Run.Status}
	if n := len(d.Events); n > 0 {
		f.lastSeq = d.Events[n-1].Seq
	}
	return f
}

// traceJSON is keel trace --json's output.
type traceJSON struct {
	Run keel.Run `json:"run"`
	*waterfall.Tree
	// UnfetchedRuns counts the sub-agent runs whose spans are not in the
	// tree (see runTrace.unfetched).
	UnfetchedRuns int `json:"unfetched_runs,omitempty"`
}

// printTrace writes tr as a waterfall, running spans ending at now: a
// summary line, the waterfall, and what its marks mean.
func printTrace(w io.Writer, tr *runTrace, o traceOptions, now time.Time) error {
	tree := waterfall.Build(tr.spans, now)
	if o.asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(traceJSON{Run: tr.run, Tree: tree, UnfetchedRuns: tr.unfetched})
	}
	r := tr.run
	var in, out int
	var cost float64
	for _, s := range tr.spans {
		in, out, cost = in+s.PromptTokens, out+s.CompletionTokens, cost+s.CostUSD
	}
	subs := ""
	if n := len(tr.runs) - 1; n > 0 {
		subs = fmt.Sprintf(" with %d sub-agent run%s", n, plural(n))
	}
	fmt.Fprintf(w, "run %s (%s, %s)%s: %d spans over %s, %d tokens in, %d out, cost %s\n",
		r.ID, r.KindOrAgent(), r.Status, subs, len(tr.spans), tree.Duration.Round(time.Millisecond), in, out, usd(cost))
	if len(tr.spans) == 0 {
		_, err := fmt.Fprintln(w, "no spans yet")
		return err
	}
	if err := waterfall.Render(w, tree, waterfall.Options{Width: traceWidth(w, o.width)}); err != nil {
		return err
	}
	fmt.Fprintf(w, "%c critical path   %c error   %c running\n", waterfall.MarkCritical, waterfall.MarkError, '>')
	if tr.unfetched > 0 {
		fmt.Fprintf(w, "%d sub-agent run%s not shown (deeper than --depth %d, or not started)\n", tr.unfetched, plural(tr.unfetched), o.depth)
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// traceWidth is the waterfall's width: --width, else $COLUMNS, else the
// width of the terminal w is, else waterfall's default.
func traceWidth(w io.Writer, flag int) int {
	if flag > 0 {
		return flag
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	if f, ok := w.(*os.File); ok && isTerminal(w) {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return cols
		}
	}
	return waterfall.DefaultWidth
}

// clearScreen moves a terminal's cursor home and clears the screen, for
// a redraw.
const clearScreen = "\x1b[H\x1b[2J"

// followTrace is keel trace --follow: it subscribes to run id and to
// each sub-agent run found live, and on each event fetches the trace
// again and, on a terminal, redraws it; when the run ends it prints the
// final waterfall and returns the run's exit code (endCode). No timer:
// only events redraw, so running spans grow as events come. Ctrl-C
// stops following (ExitDetached); the run goes on.
func followTrace(cmd *cobra.Command, c *client.Client, id keel.RunID, o traceOptions) error {
	ctx := cmd.Context()
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	tty := !o.asJSON && isTerminal(out)
	tr, err := fetchTrace(ctx, c, id, o.depth)
	if err != nil {
		return err
	}
	if code, done := statusCode(tr.run.Status); done {
		return finishTrace(out, tr, o, tty, code)
	}
	// Events arrive on a connection of their own: its reader keeps
	// taking them while a redraw waits for run.get on c, so a busy run
	// cannot fill the buffer that run.get's answer waits behind.
	ec, err := connect(cmd)
	if err != nil {
		return err
	}
	defer ec.Close()
	subscribed := map[keel.RunID]bool{}
	subscribe := func() error {
		for rid, f := range tr.runs {
			if subscribed[rid] || f.status.Terminal() {
				continue
			}
			// From the last event fetched: an event after the fetch comes
			// as a live one, so an end between the two is not missed.
			if _, err := ec.Subscribe(ctx, rid, f.lastSeq); err != nil {
				var pe *protocol.Error
				if errors.As(err, &pe) && pe.Code == protocol.CodeNotFound && rid != id {
					continue
				}
				return err
			}
			subscribed[rid] = true
		}
		return nil
	}
	stopped := func() error {
		fmt.Fprintf(errOut, "\nstopped following run %s; it goes on.\n  follow it again: keel trace --follow %s\n", id, id)
		return &exitError{code: ExitDetached}
	}
	if err := subscribe(); err != nil {
		if ctx.Err() != nil {
			return stopped()
		}
		return err
	}
	if !tty {
		fmt.Fprintf(errOut, "following run %s; its waterfall prints when it ends (Ctrl-C stops following)\n", id)
	}
	draw := true
	for {
		if tty && draw {
			fmt.Fprint(out, clearScreen)
			if err := printTrace(out, tr, o, time.Now()); err != nil {
				return err
			}
		}
		draw = true
		code, ended, redraw, err := nextEvents(ctx, ec, id, subscribed)
		switch {
		case ctx.Err() != nil:
			return stopped()
		case err != nil:
			return &exitError{code: ExitFailure, err: fmt.Errorf("%w; follow the run again with `keel trace --follow %s`", err, id)}
		case !redraw && !ended:
			draw = false
			continue
		}
		if tr, err = fetchTrace(ctx, c, id, o.depth); err != nil {
			if ctx.Err() != nil {
				return stopped()
			}
			return err
		}
		if ended {
			return finishTrace(out, tr, o, tty, code)
		}
		if err := subscribe(); err != nil {
			if ctx.Err() != nil {
				return stopped()
			}
			return err
		}
	}
}

// nextEvents waits for an event of the runs followed, then takes every
// event already queued behind it, so that a burst costs one redraw.
// ended reports run id's end, with its exit code; redraw whether any of
// the events can change the trace (model deltas cannot). err is set when
// the connection closed; ctx ending returns ctx's error.
func nextEvents(ctx context.Context, ec *client.Client, id keel.RunID, followed map[keel.RunID]bool) (code int, ended, redraw bool, err error) {
	take := func(ev keel.Event) {
		if !followed[ev.RunID] {
			return
		}
		if ev.Type != keel.EventModelDelta {
			redraw = true
		}
		if ev.RunID == id {
			if c, done := endCode(ev.Type); done {
				code, ended = c, true
			}
		}
	}
	closed := func() error {
		if err := ec.Err(); err != nil {
			return fmt.Errorf("connection to the daemon closed before the run ended: %w", err)
		}
		return errors.New("connection to the daemon closed before the run ended")
	}
	select {
	case ev, ok := <-ec.Events():
		if !ok {
			return 0, false, false, closed()
		}
		take(ev)
	case <-ctx.Done():
		return 0, false, false, ctx.Err()
	}
	for {
		select {
		case ev, ok := <-ec.Events():
			if !ok {
				if ended {
					return code, ended, redraw, nil
				}
				return 0, false, false, closed()
			}
			take(ev)
		default:
			return code, ended, redraw, nil
		}
	}
}

// statusCode is the exit code of a run that ended with status s, as
// endCode gives for its last event; done is false while it goes on.
func statusCode(s keel.RunStatus) (code int, done bool) {
	switch s {
	case keel.RunSucceeded:
		return ExitOK, true
	case keel.RunFailed:
		return ExitFailure, true
	case keel.RunCancelled:
		return ExitCancelled, true
	}
	return 0, false
}

// finishTrace prints the final waterfall of a followed run (on a
// terminal, in place of the last redraw) and exits with code.
func finishTrace(out io.Writer, tr *runTrace, o traceOptions, tty bool, code int) error {
	if tty {
		fmt.Fprint(out, clearScreen)
	}
	if err := printTrace(out, tr, o, time.Now()); err != nil {
		return err
	}
	return &exitError{code: code}
}
