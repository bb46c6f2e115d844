package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func policyCmd() *cobra.Command {
	cmd := group(&cobra.Command{Use: "policy", Short: "The policy in force: show it, explain a decision (docs/policy.md)"})
	explain := group(&cobra.Command{Use: "explain", Short: "Explain what the policy decides about a tool call or a model call, and why"})
	explain.AddCommand(explainToolCmd(), explainModelCmd(), explainKnowledgeCmd())
	cmd.AddCommand(policyShowCmd(), explain)
	return cmd
}

// absWorkspace makes a --workspace of the policy commands absolute;
// empty stays empty (no workspace).
func absWorkspace(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", &exitError{code: ExitUsage, err: fmt.Errorf("--workspace %s: %w", dir, err)}
	}
	return abs, nil
}

func policyShowCmd() *cobra.Command {
	var asJSON bool
	var ws string
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print the effective policy: each rule and lock with its layer and file:line",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := absWorkspace(ws)
			if err != nil {
				return err
			}
			return call(cmd, client.PolicyShow, protocol.PolicyShowParams{Workspace: dir}, func(r protocol.PolicyShowResult) error {
				if asJSON {
					return writeJSON(cmd, r)
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "policy version %d, digest %s\n", r.Version, r.Digest)
				if r.Error != "" {
					fmt.Fprintf(out, "the files on disk do not load; the policy shown stays in force: %s\n", r.Error)
				}
				if len(r.Files) == 0 {
					fmt.Fprintln(out, "no policy files: every action is allowed (tools still need their grants)")
				}
				for _, f := range r.Files {
					fmt.Fprintf(out, "file: %s %s\n", f.Layer, f.File)
				}
				for _, l := range r.Locks {
					fmt.Fprintf(out, "lock: %s (%s layer, %s:%d:%d)\n", l.Key, l.Layer, l.File, l.Line, l.Col)
				}
				for _, ru := range r.Rules {
					fmt.Fprintf(out, "rule %d of the %s layer (%s:%d:%d): %s %s\n  %s\n", ru.N, ru.Layer, ru.File, ru.Line, ru.Col, ru.Action, ru.Decision, ru.Text)
				}
				for _, w := range r.Warnings {
					fmt.Fprintf(out, "warning: %s\n", w)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy.show result as JSON")
	cmd.Flags().StringVar(&ws, "workspace", "", "show the policy of runs naming this workspace: with its .keel/policy.json")
	return cmd
}

func explainToolCmd() *cobra.Command {
	var run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tool NAME [ARGS_JSON]",
		Short: "Explain the decision about a call of tool NAME with ARGS_JSON (default {})",
		Args:  usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := protocol.PolicyExplainParams{Kind: protocol.PolicyKindTool, Tool: args[0], RunID: run}
			if len(args) == 2 {
				var obj map[string]json.RawMessage
				if json.Unmarshal([]byte(args[1]), &obj) != nil || obj == nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("ARGS_JSON must be a JSON object, such as '{\"path\": \"/tmp/x\"}'")}
				}
				p.Args = json.RawMessage(args[1])
			}
			return explainCall(cmd, p, asJSON)
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "decide as for this run: with its own rules and the labels its context holds")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy.explain result as JSON")
	cmd.Flags().String("workspace", "", "decide as for a run naming this workspace (default: the run's, with --run)")
	return cmd
}

func explainModelCmd() *cobra.Command {
	var run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "model PROVIDER/MODEL",
		Short: "Explain the decision about a call of MODEL at PROVIDER",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			provider, model, ok := strings.Cut(args[0], "/")
			if !ok || provider == "" || model == "" {
				return &exitError{code: ExitUsage, err: fmt.Errorf("want PROVIDER/MODEL, such as ollama/llama3.2, not %q", args[0])}
			}
			return explainCall(cmd, protocol.PolicyExplainParams{Kind: protocol.PolicyKindModel, Provider: provider, Model: model, RunID: run}, asJSON)
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "decide as for this run: with its own rules and the labels its context holds (keel show RUN lists them)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy.explain result as JSON")
	cmd.Flags().String("workspace", "", "decide as for a run naming this workspace (default: the run's, with --run)")
	return cmd
}

func explainKnowledgeCmd() *cobra.Command {
	var run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "knowledge SCOPE",
		Short: "Explain whether a run may read knowledge scope SCOPE (user, workspace:DIR, run:ID) with knowledge_search",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return explainCall(cmd, protocol.PolicyExplainParams{Kind: protocol.PolicyKindKnowledge, Scope: args[0], RunID: run}, asJSON)
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "decide as for this run: with its own rules and scopes")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy.explain result as JSON")
	cmd.Flags().String("workspace", "", "decide as for a run naming this workspace, whose scope is its own (default: the run's, with --run)")
	return cmd
}

// explainCall asks policy.explain and prints the decision. A deny is
// still ExitOK: the command answered the question.
func explainCall(cmd *cobra.Command, p protocol.PolicyExplainParams, asJSON bool) error {
	ws, _ := cmd.Flags().GetString("workspace")
	var err error
	if p.Workspace, err = absWorkspace(ws); err != nil {
		return err
	}
	return call(cmd, client.PolicyExplain, p, func(r protocol.PolicyExplainResult) error {
		if asJSON {
			return writeJSON(cmd, r)
		}
		out := cmd.OutOrStdout()
		fmt.Fprintln(out, r.Explanation)
		if r.Rule != nil {
			fmt.Fprintf(out, "  %s\n", r.Rule.Text)
		}
		fmt.Fprintf(out, "policy version %d, digest %s\n", r.Version, r.Digest)
		return nil
	})
}
