package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func runsCmd() *cobra.Command {
	var limit int
	var asJSON bool
	var status []string
	var cursor string
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List runs, newest first",
		Long: "List runs, newest first. --status keeps the runs in the given states (waiting, paused, ...; " +
			"repeat it or separate with commas); when more runs match than --limit, the last line says how to list the next ones.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := protocol.RunListParams{Limit: limit, Cursor: cursor}
			for _, st := range status {
				p.Status = append(p.Status, keel.RunStatus(st))
			}
			return call(cmd, client.RunList, p, func(page protocol.RunListResult) error {
				runs := page.Runs
				if asJSON {
					return writeJSON(cmd, runs)
				}
				if len(runs) == 0 {
					if len(status) > 0 || cursor != "" {
						fmt.Fprintln(cmd.OutOrStdout(), "no runs match")
						return nil
					}
					fmt.Fprintln(cmd.OutOrStdout(), "no runs yet; start one with: keel run \"your goal\"")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "RUN\tKIND\tSTATUS\tMODEL\tSTARTED\tGOAL")
				for _, r := range runs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, kindLabel(r), r.Status, r.Model, r.CreatedAt.Local().Format(time.DateTime), clip(r.Goal, 60))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if page.NextCursor != "" {
					next := "keel runs --limit " + strconv.Itoa(limit)
					if len(status) > 0 {
						next += " --status " + strings.Join(status, ",")
					}
					fmt.Fprintf(cmd.OutOrStdout(), "more: %s --cursor %s\n", next, page.NextCursor)
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "most runs to list (at most 1000)")
	cmd.Flags().StringSliceVar(&status, "status", nil, "only runs in these states: queued, running, waiting, paused, interrupted, succeeded, failed, cancelled")
	cmd.Flags().StringVar(&cursor, "cursor", "", "go on from where a listing stopped (its \"more:\" line)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func showCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show RUN",
		Short: "Show one run: the labels its context holds, its events (with the labels of their data) and its trace spans with tokens and durations",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, func(c *client.Client) error {
				d, err := c.GetRun(cmd.Context(), keel.RunID(args[0]))
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd, d)
				}
				out := cmd.OutOrStdout()
				r := d.Run
				fmt.Fprintf(out, "run     %s\nstatus  %s\nmodel   %s\ngoal    %s\nstarted %s\n", r.ID, r.Status, r.Model, r.Goal, r.CreatedAt.Local().Format(time.DateTime))
				if r.Error != "" {
					fmt.Fprintf(out, "reason  %s\n", r.Error)
				}
				if d.Labels != nil { // nil: the daemon does not follow labels
					held := "none"
					if len(d.Labels) > 0 {
						held = labelSet(d.Labels)
					}
					fmt.Fprintf(out, "labels: %s\n", held)
				}
				printShape(cmd.Context(), c, out, d)
				fmt.Fprintf(out, "\nevents (%d)\n", len(d.Events))
				pr := &eventPrinter{w: out}
				for _, ev := range d.Events {
					pr.print(ev)
				}
				fmt.Fprintf(out, "\ntrace (%d spans)\n", len(d.Spans))
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "STEP\tKIND\tNAME\tSTATUS\tDURATION\tTTFT\tTOKENS IN\tTOKENS OUT\tCOST\tRETRIES\tERROR")
				var in, outTok, retries int
				var cost float64
				var model, tool time.Duration
				for _, t := range spanTree(d.Spans) {
					s := t.Span
					name := spanName(s)
					ttft := "-"
					if s.TTFT > 0 {
						ttft = s.TTFT.Round(time.Millisecond).String()
					}
					fmt.Fprintf(tw, "%d\t%s%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", s.Step, strings.Repeat("  ", t.Depth), s.Kind, name, s.Status, s.Duration.Round(time.Microsecond), ttft,
						s.PromptTokens, s.CompletionTokens, usd(s.CostUSD), s.Retries, clip(s.Error, 80))
					in, outTok, cost, retries = in+s.PromptTokens, outTok+s.CompletionTokens, cost+s.CostUSD, retries+s.Retries
					switch s.Kind {
					case keel.SpanModelCall:
						model += s.Duration
					case keel.SpanToolCall:
						tool += s.Duration
					}
				}
				tw.Flush()
				fmt.Fprintf(out, "total: %d tokens in, %d out, cost %s, %d retries; model time %s, tool time %s\n", in, outTok, usd(cost), retries, model.Round(time.Millisecond), tool.Round(time.Microsecond))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usd formats a cost; local calls cost nothing.
// spanName names a span for people: a model call's as PROVIDER/MODEL,
// once, whether the span's name is the bare model or already the
// PROVIDER/MODEL the run named ("ollamav1/keel-tiny-tools", not
// "ollamav1/ollamav1/keel-tiny-tools").
func spanName(s keel.Span) string {
	if s.Provider == "" || strings.HasPrefix(s.Name, s.Provider+"/") {
		return s.Name
	}
	return s.Provider + "/" + s.Name
}

func usd(v float64) string {
	if v == 0 {
		return "$0"
	}
	return fmt.Sprintf("$%.6f", v)
}

// treeSpan is a span of a trace and its depth in the trace's tree.
type treeSpan struct {
	keel.Span
	Depth int
}

// spanTree orders a run's spans as their tree, depth first, each span's
// children in start order after it. A span whose parent is not in the
// trace (a run's root span, or a sub-agent's, whose parent is a step of
// the parent run) starts a tree of its own.
func spanTree(spans []keel.Span) []treeSpan {
	in := map[string]bool{}
	for _, s := range spans {
		in[s.ID] = true
	}
	kids := map[string][]keel.Span{}
	var roots []keel.Span
	for _, s := range spans {
		if s.ParentID == "" || !in[s.ParentID] || s.ParentID == s.ID {
			roots = append(roots, s)
		} else {
			kids[s.ParentID] = append(kids[s.ParentID], s)
		}
	}
	out := make([]treeSpan, 0, len(spans))
	seen := map[string]bool{}
	var walk func(s keel.Span, depth int)
	walk = func(s keel.Span, depth int) {
		if seen[s.ID] {
			return
		}
		seen[s.ID] = true
		out = append(out, treeSpan{s, depth})
		for _, k := range kids[s.ID] {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	for _, s := range spans {
		walk(s, 0) // in a cycle of parents (a damaged trace): shown flat, not lost
	}
	return out
}
