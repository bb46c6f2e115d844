package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func runCmd() *cobra.Command {
	var p protocol.RunStartParams
	var timeout time.Duration
	var kind kindFlags
	cmd := &cobra.Command{
		Use:   "run GOAL",
		Short: "Start a run and stream its events until it ends (Ctrl-C cancels it)",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Goal = strings.Join(args, " ")
			if err := kind.apply(cmd, &p); err != nil {
				return err
			}
			if timeout > 0 {
				p.Policy.Deadline = time.Now().Add(timeout)
			}
			return withClient(cmd, func(c *client.Client) error {
				ctx := cmd.Context()
				if err := waitForTools(cmd, c); err != nil {
					return err
				}
				run, err := c.StartRun(ctx, p)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "run %s (model %s)\n", run.ID, run.Model)
				if _, err := c.Subscribe(ctx, run.ID, 0); err != nil {
					return err
				}
				pr := &eventPrinter{w: out}
				interrupted := ctx.Done()
				var deadline <-chan time.Time
				for {
					select {
					case ev, ok := <-c.Events():
						if !ok {
							return &exitError{code: ExitFailure, err: errors.New("connection to the daemon closed before the run ended; see `keel show " + string(run.ID) + "`")}
						}
						if ev.RunID != run.ID {
							continue
						}
						pr.print(ev)
						if code, done := endCode(ev.Type); done {
							return &exitError{code: code}
						}
					case <-interrupted:
						interrupted = nil
						fmt.Fprintln(cmd.ErrOrStderr(), "\ncancelling run", run.ID)
						cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
						_, err := c.CancelRun(cctx, run.ID)
						cancel()
						if err != nil {
							return &exitError{code: ExitCancelled, err: fmt.Errorf("cancel %s: %s", run.ID, describe(err))}
						}
						deadline = time.After(10 * time.Second)
					case <-deadline:
						return &exitError{code: ExitCancelled, err: fmt.Errorf("run %s did not confirm cancellation in time", run.ID)}
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&p.Model, "model", "", "model to use (default: the daemon's default)")
	cmd.Flags().IntVar(&p.MaxSteps, "max-steps", 0, "most model calls the run may make (default 8)")
	cmd.Flags().BoolVar(&p.Policy.AllowCloud, "allow-cloud", false, "let this run use cloud models, where the daemon's models configuration allows cloud")
	cmd.Flags().BoolVar(&p.Policy.Private, "private", false, "treat everything in this run as private: it never leaves this machine")
	cmd.Flags().Int64Var(&p.Policy.BudgetTokens, "budget-tokens", 0, "most tokens the run's model calls may spend (0: no cap)")
	cmd.Flags().Float64Var(&p.Policy.BudgetUSD, "budget-usd", 0, "most US dollars the run's model calls may spend (0: no cap)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "fail the run if it has not ended this long after it starts, across daemon restarts (0: no limit)")
	cmd.Flags().DurationVar(&p.Policy.StepTimeout, "step-timeout", 0, "bound each model call and tool call of the run (0: the model layer's and the sandbox's own limits)")
	cmd.Flags().IntVar(&p.Policy.ModelRetries, "model-retries", 0, "try a failed model step this many more times (timeouts, overload, invalid output) before the run fails")
	cmd.Flags().IntVar(&p.Policy.ToolRetries, "tool-retries", 0, "try a tool call that timed out or crashed this many more times; read-only and idempotent tools only")
	cmd.Flags().DurationVar(&p.Policy.RetryBackoff, "retry-backoff", 0, "wait before the first retry, doubled before each next one (default 200ms)")
	kind.register(cmd)
	cmd.Flags().StringVar(&p.IdempotencyKey, "idempotency-key", "", "a key that makes repeating this command safe: a start with a key already used shows that run instead of starting another")
	return cmd
}

// endCode maps a run's final event to the CLI's exit code.
func endCode(t keel.EventType) (int, bool) {
	switch t {
	case keel.EventRunSucceeded:
		return ExitOK, true
	case keel.EventRunFailed, keel.EventRunInterrupted:
		return ExitFailure, true
	case keel.EventRunCancelled:
		return ExitCancelled, true
	}
	return 0, false
}
