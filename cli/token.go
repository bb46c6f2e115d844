package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func tokenCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "token",
		Short: "Per-client tokens (an editor, a script, a web page): create, list, revoke",
		Long: `A client token lets one client (an editor extension, a script, a web page) use the
daemon with only the scopes it needs, from the browser origins you name, until
you revoke it. The daemon keeps only a hash of each token.

Scopes: read (list and follow runs, tools, models, policy), run (start, steer
and stop runs, call tools and models), approve (answer approvals and decisions,
declassify), tools (install, grant, revoke, remove tools), admin (tokens,
console logins, model downloads).`,
	})
	var (
		name    string
		scopes  []string
		origins []string
		expires string
	)
	create := &cobra.Command{
		Use:   "create --name NAME",
		Short: "Create a client token and print it, once",
		Example: `  keel token create --name vscode --scope read,run,approve --origin 'vscode-webview://*'
  keel token create --name ci --scope read --expires 30d`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := protocol.TokenCreateParams{Name: name, Scopes: scopes, Origins: origins}
			if expires != "" {
				d, err := parseLifetime(expires)
				if err != nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--expires %q: %w", expires, err)}
				}
				p.ExpiresAt = time.Now().Add(d)
			}
			return call(cmd, client.TokenCreate, p, func(r protocol.TokenCreateResult) error {
				fmt.Fprintln(cmd.OutOrStdout(), r.Token)
				fmt.Fprintf(cmd.ErrOrStderr(), "client token %q: scopes %s; %s; %s.\nThis is the only time it is shown: keep it secret. Revoke it with: keel token revoke %s\n",
					r.Info.Name, strings.Join(r.Info.Scopes, ","), originsText(r.Info.Origins), expiryText(r.Info.Expires), r.Info.Name)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "", "the token's name, for list and revoke (required)")
	create.Flags().StringSliceVar(&scopes, "scope", []string{"read"}, "what it may do: read, run, approve, tools, admin (comma-separated)")
	create.Flags().StringArrayVar(&origins, "origin", nil, "origin (or pattern: http://localhost:*, https://*.example.com, vscode-webview://*) of browser pages that may use it (repeatable)")
	create.Flags().StringVar(&expires, "expires", "", "lifetime, such as 12h or 30d (default: until revoked)")
	create.MarkFlagRequired("name")

	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List client tokens: name, scopes, origins, created, last used (never the token)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.TokenList, client.None{}, func(r protocol.TokenListResult) error {
				if asJSON {
					return writeJSON(cmd, r.Tokens)
				}
				if len(r.Tokens) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no client tokens")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSCOPES\tORIGINS\tCREATED\tLAST USED\tEXPIRES")
				for _, t := range r.Tokens {
					o := strings.Join(t.Origins, ",")
					if o == "" {
						o = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, strings.Join(t.Scopes, ","), o, when(t.Created), when(t.LastUsed), when(t.Expires))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a client token; its open connections are closed",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, client.TokenRevoke, protocol.TokenRevokeParams{Name: args[0]}, func(r protocol.TokenRevokeResult) error {
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s; closed %d connection(s)\n", args[0], r.Closed)
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// parseLifetime parses a Go duration, or a whole number of days ("30d").
func parseLifetime(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, fmt.Errorf("want a duration such as 12h or 30d")
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("want a duration such as 12h or 30d")
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("must be positive")
	}
	return d, nil
}

func originsText(origins []string) string {
	if len(origins) == 0 {
		return "no browser origins of its own"
	}
	return "browser origins " + strings.Join(origins, ", ")
}

func expiryText(t time.Time) string {
	if t.IsZero() {
		return "valid until revoked"
	}
	return "expires " + t.Local().Format("2006-01-02 15:04")
}

// when formats a time for a table; the zero time is "never".
func when(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Local().Format("2006-01-02 15:04")
}
