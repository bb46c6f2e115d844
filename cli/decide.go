package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func decideCmd() *cobra.Command {
	var output, note string
	cmd := &cobra.Command{
		Use:   "decide RUN CALL retry|skip|done",
		Short: "Release a run waiting on a tool call whose outcome is unknown: run it again, skip it, or mark it done",
		Long: "A run waits when the daemon stopped while a tool that is not idempotent was running: keel cannot know\n" +
			"whether it took effect, so it does not run it again by itself. Check, then decide:\n" +
			"  retry  run the call again\n  skip   do not; the model is told it was skipped\n" +
			"  done   it did happen; --output gives its result to the model",
		Args: usageArgs(cobra.ExactArgs(3)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := protocol.RunDecideParams{RunID: keel.RunID(args[0]), CallID: args[1], Decision: args[2], Note: note}
			var err error
			if p.Output, err = jsonFlag("output", output); err != nil {
				return err
			}
			return call(cmd, client.RunDecide, p, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: %s recorded for call %s; the run goes on (follow it with keel show %s)\n", r.ID, p.Decision, p.CallID, r.ID)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&output, "output", "", "with done: the call's result as JSON, as the model should see it")
	cmd.Flags().StringVar(&note, "note", "", "why, for the journal")
	return cmd
}

// runControlCmd is keel pause, keel resume and keel cancel: one run, one
// request m, the run's new state printed.
func runControlCmd(use, short, done string, m client.Method[protocol.RunRef, keel.Run]) *cobra.Command {
	return &cobra.Command{
		Use:   use + " RUN",
		Short: short,
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, m, protocol.RunRef{RunID: keel.RunID(args[0])}, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: %s (now %s)\n", r.ID, done, r.Status)
				return nil
			})
		},
	}
}

func pauseCmd() *cobra.Command {
	return runControlCmd("pause", "Pause a running run at its next step boundary (a call in flight finishes first)", "pause requested",
		client.RunPause)
}

func resumeCmd() *cobra.Command {
	return runControlCmd("resume", "Let a paused run go on from where it stopped", "resumed", client.RunResume)
}

func cancelCmd() *cobra.Command {
	return runControlCmd("cancel", "Cancel a run: in-flight model streams and tool calls stop", "cancelled", client.RunCancel)
}

func replayCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "replay RUN",
		Short: "Run a finished run again from its journal, calling no model and no tool, and check the events match",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, client.RunReplay, protocol.RunRef{RunID: keel.RunID(args[0])}, func(res protocol.RunReplayResult) error {
				if asJSON {
					return writeJSON(cmd, res)
				}
				pr := &eventPrinter{w: cmd.OutOrStdout()}
				for _, ev := range res.Events {
					pr.print(ev)
				}
				if !res.Matches {
					return &exitError{code: ExitFailure, err: fmt.Errorf("the replay differs from the journal: %s", res.Difference)}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "\nreplay matches the journal (%d events; times and durations aside)\n", len(res.Events))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// approvalCmd is keel approve and keel deny: the call is named by run and
// call id, and the arguments shown are looked up and hashed here, from
// the run's approval.requested, so what is approved is what was shown.
func approvalCmd(approve bool) *cobra.Command {
	var reason, edit, sha string
	use, short := "deny", "Deny a tool call a run is waiting to have approved; the model sees the reason"
	if approve {
		use, short = "approve", "Approve a tool call a run is waiting on (optionally with edited arguments)"
	}
	cmd := &cobra.Command{
		Use:   use + " RUN CALL",
		Short: short,
		Args:  usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := protocol.RunApproveParams{RunID: keel.RunID(args[0]), CallID: args[1], Approved: approve, Reason: reason, ArgsSHA256: sha}
			var err error
			if p.Arguments, err = jsonFlag("edit", edit); err != nil {
				return err
			}
			return withClient(cmd, func(c *client.Client) error {
				if p.ArgsSHA256 == "" {
					det, err := c.GetRun(cmd.Context(), p.RunID)
					if err != nil {
						return err
					}
					for _, ev := range det.Events {
						var d keel.ApprovalRequestData
						if ev.Type == keel.EventApprovalAsked && json.Unmarshal(ev.Data, &d) == nil && d.Call.ID == p.CallID {
							p.ArgsSHA256 = d.ArgsSHA256
							fmt.Fprintf(cmd.OutOrStdout(), "call %s: %s %s\n", d.Call.ID, d.Call.Name, clip(string(d.Call.Arguments), 2000))
						}
					}
					if p.ArgsSHA256 == "" {
						return &exitError{code: ExitFailure, err: fmt.Errorf("run %s asked no approval for call %s", p.RunID, p.CallID)}
					}
				}
				r, err := c.ApproveRun(cmd.Context(), p)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: call %s %sd; the run goes on (now %s)\n", r.ID, p.CallID, use, r.Status)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&sha, "sha256", "", "the arguments' hash as shown; default: the one the run asked about")
	if approve {
		cmd.Flags().StringVar(&edit, "edit", "", "replace the call's arguments (JSON) before it runs")
	} else {
		cmd.Flags().StringVar(&reason, "reason", "", "why, for the model")
	}
	return cmd
}

func sayCmd() *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "say RUN [--label LABEL]... MESSAGE",
		Short: "Tell a run something: the model reads it before its next step (to correct its direction)",
		Args:  usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := protocol.RunSayParams{RunID: keel.RunID(args[0]), Message: strings.Join(args[1:], " "), Labels: labels}
			return call(cmd, client.RunSay, p, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: message recorded; the model reads it before its next step (now %s)\n", r.ID, r.Status)
				return nil
			})
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label of the message (private, secret, pii or one of your own; repeat for more): it enters the run's context with it")
	return cmd
}

func declassifyCmd() *cobra.Command {
	var reason, by string
	cmd := &cobra.Command{
		Use:   "declassify RUN LABEL --reason TEXT [--by NAME]",
		Short: "Clear a label from what a run's context holds, saying why (journaled with who and why; data read later with the label brings it back)",
		Args:  usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--reason is required: say why %s may be cleared (see %s --help)", args[1], cmd.CommandPath())}
			}
			p := protocol.RunDeclassifyParams{RunID: keel.RunID(args[0]), Label: args[1], Reason: reason, By: by}
			return call(cmd, client.RunDeclassify, p, func(d protocol.RunDeclassifyResult) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: label %s cleared by %s; the context now holds %s\n", p.RunID, d.Label, d.By, labelSet(d.Labels))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the label may be cleared (required; journaled)")
	cmd.Flags().StringVar(&by, "by", "", "who decides (default: the client's name, keel-cli)")
	return cmd
}
