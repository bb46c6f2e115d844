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

// Taking a run over, handing it back, and forking it.

func takeOverCmd() *cobra.Command {
	var note string
	cmd := &cobra.Command{
		Use:   "takeover RUN",
		Short: "Take control of a run: it stops at its next step boundary until you hand it back (keel handback)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, client.RunTakeOver, protocol.RunControlParams{RunID: keel.RunID(args[0]), Note: note}, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: taken over (now %s); run its tools with `keel tools call --run %s NAME JSON`, then `keel handback %s`\n", r.ID, r.Status, r.ID, r.ID)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why, for the record")
	return cmd
}

func handBackCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "handback RUN [MESSAGE]",
		Short: "Hand a taken-over run back: it goes on, and the model reads what you did and MESSAGE first",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := protocol.RunControlParams{RunID: keel.RunID(args[0]), Note: strings.Join(args[1:], " ")}
			return call(cmd, client.RunHandBack, p, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s: handed back (now %s)\n", r.ID, r.Status)
				return nil
			})
		},
	}
}

func forkCmd() *cobra.Command {
	var p protocol.RunForkParams
	cmd := &cobra.Command{
		Use:   "fork RUN",
		Short: "Start a new run from RUN's journal up to and including --step, with another --model or --goal",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.RunID = keel.RunID(args[0])
			return call(cmd, client.RunFork, p, func(r keel.Run) error {
				fmt.Fprintf(cmd.OutOrStdout(), "run %s forked from %s at step %d (model %s); follow it with `keel show %s`\n", r.ID, p.RunID, p.Step, r.Model, r.ID)
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&p.Step, "step", 0, "the last step of RUN the fork keeps, with its tool results (0: only the goal)")
	cmd.Flags().StringVar(&p.Model, "model", "", "the model the fork uses from then on (default: RUN's)")
	cmd.Flags().StringVar(&p.Goal, "goal", "", "an edited goal (default: RUN's)")
	return cmd
}

// runToolFor runs a tool on behalf of a taken-over run: `keel tool call
// --run RUN NAME JSON`.
func runToolFor(cmd *cobra.Command, run, name string, input json.RawMessage) error {
	return call(cmd, client.RunTool, protocol.RunToolParams{RunID: keel.RunID(run), Name: name, Arguments: input}, func(res protocol.RunToolResult) error {
		if res.Error != nil {
			return &exitError{code: ExitFailure, err: fmt.Errorf("tool %s failed (recorded in run %s; the model reads it when you hand the run back): %s", name, run, res.Error.Error())}
		}
		fmt.Fprintln(cmd.OutOrStdout(), indent(res.Output))
		fmt.Fprintf(cmd.ErrOrStderr(), "(recorded in run %s; the model reads it when you hand the run back)\n", run)
		return nil
	})
}
