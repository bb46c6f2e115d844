package cli

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
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
			if output != "" {
				if !json.Valid([]byte(output)) {
					return &exitError{code: ExitUsage, err: errors.New("--output must be JSON")}
				}
				p.Output = json.RawMessage(output)
			}
			c, err := connect(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Decide(cmd.Context(), p)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s: %s recorded for call %s; the run goes on (follow it with keel show %s)\n", r.ID, p.Decision, p.CallID, r.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&output, "output", "", "with done: the call's result as JSON, as the model should see it")
	cmd.Flags().StringVar(&note, "note", "", "why, for the journal")
	return cmd
}
