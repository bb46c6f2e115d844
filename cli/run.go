package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
	var detach bool
	var tools []string
	var ws workspaceFlags
	var policyFile string
	var remember rememberFlags
	cmd := &cobra.Command{
		Use:   "run GOAL",
		Short: "Start a run and stream its events until it ends (Ctrl-C detaches: the run goes on)",
		Long: `Start a run and stream its events until it ends.

Ctrl-C detaches: the CLI stops following and exits 130, the run goes on in
the daemon. Follow it again with 'keel attach RUN', stop it with
'keel cancel RUN'. --detach starts the run and returns at once.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Goal = strings.Join(args, " ")
			if err := kind.apply(cmd, &p); err != nil {
				return err
			}
			if timeout > 0 {
				p.Policy.Deadline = time.Now().Add(timeout)
			}
			var err error
			if p.Workspace, err = ws.dir(); err != nil {
				return err
			}
			if remember.on && detach {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--remember saves the run's outcome once it ends: not with --detach (keel attach the run, or remember it later with knowledge.remember)")}
			}
			if !remember.on && remember.scope != "" {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--scope says where --remember saves the outcome: give --remember too")}
			}
			if policyFile != "" {
				if p.Policy.Rules, err = readRunRules(policyFile); err != nil {
					return err
				}
			}
			return withClient(cmd, func(c *client.Client) error {
				ctx := cmd.Context()
				if err := waitForTools(cmd, c); err != nil {
					return err
				}
				if cmd.Flags().Changed("tools") {
					if err := checkRunTools(cmd, c, tools); err != nil {
						return err
					}
					p.Policy.Tools = append([]string{}, tools...) // [] is "no tools", nil is every tool
				}
				run, err := c.StartRun(ctx, p)
				if err != nil {
					return err
				}
				for _, w := range run.Warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "keel: warning: --policy %s: %s\n", policyFile, w)
				}
				out := cmd.OutOrStdout()
				if detach {
					// The run id alone on stdout, for scripts; how to
					// follow it on stderr, for people.
					fmt.Fprintln(out, run.ID)
					fmt.Fprintf(cmd.ErrOrStderr(), "run %s started (model %s); follow it with: keel attach %s\n", run.ID, run.Model, run.ID)
					return nil
				}
				fmt.Fprintf(out, "run %s (model %s)\n", run.ID, run.Model)
				err = follow(cmd, c, run.ID, 1)
				if remember.on {
					return remember.save(cmd, c, run.ID, err)
				}
				return err
			})
		},
	}
	ws.add(cmd)
	remember.add(cmd)
	cmd.Flags().StringVar(&policyFile, "policy", "", "a policy file of this run's own rules, its run layer (docs/policy.md): they can tighten what the other layers allow, never loosen it")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the run, print its id and return; it goes on in the daemon (keel attach RUN follows it)")
	cmd.Flags().StringSliceVar(&tools, "tools", nil, "the only tools the run may call, comma-separated (--tools= for none; default: every installed tool)")
	cmd.Flags().StringVar(&p.Model, "model", "", "model to use (default: the daemon's default)")
	cmd.Flags().IntVar(&p.MaxSteps, "max-steps", 0, "most model calls the run may make (default 8)")
	cmd.Flags().BoolVar(&p.Policy.AllowCloud, "allow-cloud", false, "let this run use cloud models, where the daemon's models configuration allows cloud")
	cmd.Flags().BoolVar(&p.Policy.Private, "private", false, "treat everything in this run as private: it never leaves this machine")
	cmd.Flags().StringArrayVar(&p.Policy.Labels, "label", nil, "a label of the goal (private, secret, pii or one of your own; repeat for more): it is in the run's context from the start (docs/policy.md)")
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

func attachCmd() *cobra.Command {
	var from int64
	cmd := &cobra.Command{
		Use:   "attach RUN",
		Short: "Follow a run's events live, from its journal's event --from on, until it ends (Ctrl-C detaches)",
		Long: `Follow a run's events, as 'keel run' does: the journal's events from seq
--from on (default: all of them), then the live ones until the run ends.
The exit code is the run's, as for 'keel run'. Ctrl-C detaches again;
the run goes on.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from < 1 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--from %d: event seqs start at 1", from)}
			}
			return withClient(cmd, func(c *client.Client) error {
				return follow(cmd, c, keel.RunID(args[0]), from)
			})
		},
	}
	cmd.Flags().Int64Var(&from, "from", 1, "first event to show, by its seq (the number at the start of each line)")
	return cmd
}

// follow prints the events of run id from seq from on, then its live
// ones, until the run ends; the exit code is the run's (endCode). Ctrl-C
// (the command's context ending) detaches: the run goes on, and follow
// says how to attach again and how to cancel, and returns ExitDetached.
func follow(cmd *cobra.Command, c *client.Client, id keel.RunID, from int64) error {
	ctx := cmd.Context()
	pr := &eventPrinter{w: cmd.OutOrStdout()}
	detached := func(next int64) error {
		pr.closeStream()
		fmt.Fprintf(cmd.ErrOrStderr(), "\ndetached from run %s; it goes on.\n  follow it again: keel attach %s --from %d\n  cancel it:       keel cancel %s\n", id, id, next, id)
		return &exitError{code: ExitDetached}
	}
	sub, err := c.Subscribe(ctx, id, from-1)
	if err != nil {
		if ctx.Err() != nil {
			return detached(from) // Ctrl-C before the first event
		}
		return err
	}
	if sub.Status.Terminal() {
		// Its events are all in the journal: print them from there, so
		// that a --from past the end does not wait for events that will
		// never come.
		det, err := c.GetRun(ctx, id)
		if err != nil {
			return err
		}
		code := ExitOK
		for _, ev := range det.Events {
			if ev.Seq < from {
				continue
			}
			pr.print(ev)
		}
		pr.closeStream()
		switch det.Run.Status {
		case keel.RunFailed:
			code = ExitFailure
		case keel.RunCancelled:
			code = ExitCancelled
		}
		return &exitError{code: code}
	}
	next := from // the first seq not yet shown
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return &exitError{code: ExitFailure, err: fmt.Errorf("connection to the daemon closed before the run ended; follow it again with `keel attach %s --from %d`", id, next)}
			}
			if ev.RunID != id {
				continue
			}
			pr.print(ev)
			next = ev.Seq + 1
			if code, done := endCode(ev.Type); done {
				return &exitError{code: code}
			}
		case <-ctx.Done():
			return detached(next)
		}
	}
}

// checkRunTools refuses a --tools list naming a tool that is not
// installed (a typo would otherwise leave the run without it, silently),
// as a usage error that lists what is installed.
func checkRunTools(cmd *cobra.Command, c *client.Client, names []string) error {
	installed, err := c.ListTools(cmd.Context())
	if err != nil {
		return err
	}
	have := make([]string, 0, len(installed))
	for _, t := range installed {
		have = append(have, t.Name)
	}
	for _, n := range names {
		if !slices.Contains(have, n) {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--tools: no tool named %q is installed (installed: %s; see keel tools list)", n, strings.Join(have, ", "))}
		}
	}
	return nil
}

// maxPolicyFile is the largest policy file the daemon reads (the policy
// package's MaxFileSize, which the CLI does not import).
const maxPolicyFile = 1 << 20

// readRunRules reads the policy file of keel run --policy, to send as
// the run's rules (policy.rules): its text in a JSON string, so that the
// daemon's explanations and errors name its lines and columns. A file
// that cannot be read, or is larger than a policy file may be, is a
// usage error.
func readRunRules(path string) (json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--policy: %w", err)}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPolicyFile+1))
	switch {
	case err != nil:
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--policy: %w", err)}
	case len(data) > maxPolicyFile:
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--policy %s: larger than %d bytes", path, maxPolicyFile)}
	}
	raw, err := json.Marshal(string(data))
	if err != nil {
		return nil, fmt.Errorf("--policy %s: %w", path, err)
	}
	return raw, nil
}

// workspaceFlags are a run's --workspace and --no-workspace: the
// directory whose .keel/policy.json is the run's workspace policy layer.
type workspaceFlags struct {
	path string
	none bool
}

func (f *workspaceFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "workspace", "", "the run's workspace: its .keel/policy.json is a policy layer of the run (default: the current directory)")
	cmd.Flags().BoolVar(&f.none, "no-workspace", false, "the run names no workspace: no workspace policy layer")
}

// dir returns the workspace to send: "" with --no-workspace, else the
// --workspace directory or the current one, made absolute.
func (f *workspaceFlags) dir() (string, error) {
	if f.none && f.path != "" {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("--workspace and --no-workspace: give one")}
	}
	if f.none {
		return "", nil
	}
	d := f.path
	if d == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("the current directory, the run's default workspace: %w (pass --workspace DIR or --no-workspace)", err)
		}
		return wd, nil
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("--workspace %s: %w", d, err)}
	}
	return abs, nil
}

// rememberFlags are keel run's --remember and --scope: save the run's
// outcome into the knowledge store once it ends (knowledge.remember).
type rememberFlags struct {
	on    bool
	scope string
}

func (f *rememberFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.on, "remember", false, "once the run ends, save its outcome (goal and result) into the knowledge store, where later runs can search it")
	cmd.Flags().StringVar(&f.scope, "scope", "", "with --remember: the knowledge scope to save into (default: the run's workspace scope, or user without a workspace)")
}

// save remembers run id, which follow ended with ended (nil: it
// succeeded), unless the CLI detached from it; it returns ended, or the
// error of remembering.
func (f *rememberFlags) save(cmd *cobra.Command, c *client.Client, id keel.RunID, ended error) error {
	var ee *exitError
	if ended != nil && (!errors.As(ended, &ee) || ee.code == ExitDetached) {
		return ended
	}
	doc, err := client.Do(cmd.Context(), c, client.KnowledgeRemember, protocol.KnowledgeRememberParams{RunID: id, Scope: f.scope})
	if err != nil {
		return fmt.Errorf("remember run %s: %w", id, err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "remembered run %s's outcome in %s (%s)\n", id, doc.Scope, doc.ID)
	return ended
}
