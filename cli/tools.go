package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func toolsCmd() *cobra.Command {
	cmd := group(&cobra.Command{Use: "tools", Aliases: []string{"tool"}, Short: "Installed tools: list, call, install, grant, revoke, remove, audit (`keel tool` is the same command)"})
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List installed tools with their schemas and grants",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.ToolsList, client.None{}, func(res protocol.ToolsListResult) error {
				tools := res.Tools
				if res.Compiling != nil {
					note := "the list is partial"
					if len(tools) == res.Compiling.Total {
						note = "a call of one still compiling waits for it"
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "compiling tools: %d of %d done; %s\n", res.Compiling.Loaded, res.Compiling.Total, note)
				}
				if asJSON {
					return writeJSON(cmd, tools)
				}
				out := cmd.OutOrStdout()
				if len(tools) == 0 {
					if res.Compiling == nil {
						fmt.Fprintln(out, "no tools installed")
					}
					return nil
				}
				for _, t := range tools {
					state := ""
					if t.Compiling {
						state = ", compiling"
					}
					fmt.Fprintf(out, "%s %s  (%s%s)\n  %s\n", t.Name, t.Version, t.SideEffects, state, t.Description)
					if t.Grants.Empty() {
						fmt.Fprintln(out, "  grants: none")
					}
					if len(t.Labels) > 0 {
						fmt.Fprintf(out, "  output labels: %s\n", strings.Join(t.Labels, ", "))
					}
					for _, g := range t.Grants.FS {
						fmt.Fprintf(out, "  grants: %s → %s (%s)\n", g.GuestPath, g.HostPath, fsMode(g))
					}
					for _, n := range t.Grants.Network {
						fmt.Fprintf(out, "  grants: network %s\n", n)
					}
					if missing := ungranted(t.Requests, t.Grants); !missing.Empty() {
						fmt.Fprintln(out, "  requested but not granted (calls needing it fail):")
						describeGrants(out, "    ", missing)
					}
					describePending(out, "  ", t.Name, t.GrantDigest, t.PendingGrants)
					fmt.Fprintf(out, "  input:  %s\n", compact(t.InputSchema))
					if len(t.OutputSchema) > 0 {
						fmt.Fprintf(out, "  output: %s\n", compact(t.OutputSchema))
					}
					fmt.Fprintln(out)
				}
				return nil
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(list, callCmd(), auditCmd(), installCmd(), removeCmd(), grantCmd(), revokeCmd())
	return cmd
}

func auditCmd() *cobra.Command {
	var tool string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit trail of tool calls: tool, version, hash, caller, arguments hash, grants, outcome, duration, and the decision, labels and hosts of each",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.ToolsAudit, protocol.ToolsAuditParams{Tool: tool, Limit: limit}, func(res protocol.ToolsAuditResult) error {
				recs := res.Records
				if asJSON {
					return writeJSON(cmd, recs)
				}
				if len(recs) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no tool calls recorded")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TIME\tTOOL\tVERSION\tMODULE\tCALLER\tARGS\tGRANTS\tOUTCOME\tDURATION")
				for _, r := range recs {
					caller := "direct"
					if r.RunID != "" {
						caller = fmt.Sprintf("%s step %d", r.RunID, r.Step)
					}
					grants := strings.Join(r.Grants, ",")
					if grants == "" {
						grants = "none"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format(time.DateTime), r.Tool, r.Version,
						short(r.SHA256), caller, short(r.ArgsSHA256), grants, r.Outcome, r.Duration.Round(time.Microsecond))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				// What decided each call, and what it read and reached,
				// below the table: the explanations are long.
				out := cmd.OutOrStdout()
				for _, r := range recs {
					if r.Policy == nil && len(r.Labels) == 0 && len(r.Hosts) == 0 && len(r.Refused) == 0 {
						continue
					}
					who := "direct"
					if r.RunID != "" {
						who = fmt.Sprintf("%s %s", r.RunID, r.CallID)
					}
					fmt.Fprintf(out, "\n#%d %s (%s) %s\n", r.ID, r.Tool, who, r.Outcome)
					if r.Policy != nil {
						fmt.Fprintf(out, "  policy  %s: %s\n", r.Policy.Outcome, r.Policy.Explanation)
					}
					for _, f := range r.Refused {
						fmt.Fprintf(out, "  refused %s: %s: %s\n", f.Destination, f.Decision.Outcome, f.Decision.Explanation)
					}
					if len(r.Labels) > 0 {
						fmt.Fprintf(out, "  labels  %s\n", strings.Join(r.Labels, ", "))
					}
					if len(r.Hosts) > 0 {
						fmt.Fprintf(out, "  hosts   %s\n", strings.Join(r.Hosts, ", "))
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&tool, "tool", "", "only this tool's calls")
	cmd.Flags().IntVar(&limit, "limit", 50, "most records to show, newest first")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

func callCmd() *cobra.Command {
	var run string
	cmd := &cobra.Command{
		Use:   "call NAME JSON",
		Short: "Run a tool directly with JSON input, no model involved (with --run, on behalf of a run you took over)",
		Args:  usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !json.Valid([]byte(args[1])) {
				return &exitError{code: ExitUsage, err: fmt.Errorf("input is not valid JSON: %s", clip(args[1], 80))}
			}
			if run != "" {
				return runToolFor(cmd, run, args[0], json.RawMessage(args[1]))
			}
			return withClient(cmd, func(c *client.Client) error {
				if err := noteCompiling(cmd, c, args[0]); err != nil {
					return err
				}
				res, err := c.CallTool(cmd.Context(), args[0], json.RawMessage(args[1]))
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), indent(res.Output))
				fmt.Fprintf(cmd.ErrOrStderr(), "(%s in %dms)\n", args[0], res.DurationMS)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "run the tool on behalf of this run, which you took over (keel takeover); the model reads the outcome when you hand it back")
	return cmd
}

// noteCompiling says so when the daemon is still compiling the tools it
// found at start and name is not among those done: the call then waits
// for that tool, which the daemon compiles next.
func noteCompiling(cmd *cobra.Command, c *client.Client, name string) error {
	res, err := c.ToolsList(cmd.Context())
	if err != nil {
		return err
	}
	if res.Compiling == nil || slices.ContainsFunc(res.Tools, func(t protocol.ToolInfo) bool { return t.Name == name && !t.Compiling }) {
		return nil
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "the daemon is still compiling its tools (%d of %d done); waiting for %s, which it compiles next\n", res.Compiling.Loaded, res.Compiling.Total, name)
	return nil
}

// waitForTools shows the daemon's progress while it is still compiling
// the tools it found at start (a first start compiles every bundled tool,
// which takes seconds), and returns once they are loaded.
func waitForTools(cmd *cobra.Command, c *client.Client) error {
	errw := cmd.ErrOrStderr()
	var pr *progress
	for {
		res, err := c.ToolsList(cmd.Context())
		if err != nil {
			if pr != nil {
				pr.end()
			}
			return err
		}
		if res.Compiling == nil {
			if pr != nil {
				pr.end()
				fmt.Fprintln(errw, "tools ready")
			}
			return nil
		}
		if pr == nil {
			pr = newProgress(errw, isTerminal(errw), false)
		}
		pr.set("waiting for the daemon to compile its tools", int64(res.Compiling.Loaded), int64(res.Compiling.Total))
		// The daemon says tools.changed as each tool loads and when the
		// load ends; the tick is only for a daemon that does not.
		select {
		case <-cmd.Context().Done():
			pr.end()
			return cmd.Context().Err()
		case <-c.ToolsChanged():
		case <-time.After(2 * time.Second):
		}
	}
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

func indent(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}
