package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// knowledgeCmd is `keel knowledge`: the knowledge store
// (docs/knowledge.md).
func knowledgeCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "knowledge",
		Short: "Index notes, documents and code for runs to search; list, search and forget them",
		Long: `The knowledge store: files indexed into scopes, which runs search with the
knowledge_search tool where the policy lets them (docs/knowledge.md).

A scope is "user", "workspace:DIR" or "run:ID". The default scope of these
commands is the workspace scope of the current directory, the one 'keel run'
started here reads without any policy rule; "user" is read only by runs a
knowledge rule of the policy allows.`,
	})
	cmd.AddCommand(knowledgeAddCmd(), knowledgeWatchCmd(), knowledgeUnwatchCmd(), knowledgeListCmd(), knowledgeSearchCmd(),
		knowledgeForgetCmd(), knowledgeLabelCmd())
	return cmd
}

// scopeFlag is a command's --scope: a scope, by default the workspace
// scope of the current directory.
type scopeFlag struct{ scope string }

func (f *scopeFlag) add(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.scope, "scope", "", what+` (user, workspace:DIR or run:ID; default: workspace:CURRENT-DIR)`)
}

func (f *scopeFlag) value() (string, error) {
	if f.scope != "" {
		return f.scope, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("the current directory, whose workspace scope is the default: %w (pass --scope)", err)
	}
	return "workspace:" + wd, nil
}

// absAll makes paths absolute: the daemon reads them, from its own
// working directory.
func absAll(paths []string) ([]string, error) {
	out := make([]string, len(paths))
	for i, p := range paths {
		a, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

func knowledgeAddCmd() *cobra.Command {
	var sf scopeFlag
	var labels []string
	cmd := &cobra.Command{
		Use:   "add PATH|DIR...",
		Short: "Index files and directories (recursively) into a scope",
		Long: `Index files and directories into a scope: text, Markdown and source code,
chunked by headings and functions. Hidden directories, .git and node_modules
are left out; binary and oversized files are skipped with a reason. A file
indexed before and unchanged is not read again.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope, err := sf.value()
			if err != nil {
				return err
			}
			paths, err := absAll(args)
			if err != nil {
				return err
			}
			return withClient(cmd, func(c *client.Client) error {
				errw := cmd.ErrOrStderr()
				tty := isTerminal(errw)
				pr := newProgress(errw, tty, false)
				res, err := client.DoStream(cmd.Context(), c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: paths, Scope: scope, Labels: labels},
					func(p protocol.KnowledgeProgress) {
						if tty {
							pr.set("indexing "+filepath.Base(p.Path), int64(p.FilesDone), int64(p.Files))
						}
					})
				pr.end()
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "%s: %d added, %d updated, %d unchanged", res.Scope, res.Added, res.Updated, res.Unchanged)
				if res.Forgotten > 0 {
					fmt.Fprintf(out, ", %d gone and forgotten", res.Forgotten)
				}
				fmt.Fprintf(out, " (%d chunks)\n", res.Chunks)
				for _, s := range res.Skipped {
					fmt.Fprintf(out, "skipped %s: %s\n", s.Path, s.Reason)
				}
				return nil
			})
		},
	}
	sf.add(cmd, "the scope to index into")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label of the scope when this makes it (private, secret, pii or one of your own; repeat for more)")
	return cmd
}

func knowledgeWatchCmd() *cobra.Command {
	var sf scopeFlag
	var labels []string
	cmd := &cobra.Command{
		Use:   "watch DIR",
		Short: "Index a directory and keep it indexed as it changes, across daemon restarts",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope, err := sf.value()
			if err != nil {
				return err
			}
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			return call(cmd, client.KnowledgeWatch, protocol.KnowledgeWatchParams{Dir: dir, Scope: scope, Labels: labels}, func(w protocol.KnowledgeWatch) error {
				fmt.Fprintf(cmd.OutOrStdout(), "watching %s into %s\n", w.Dir, w.Scope)
				return nil
			})
		},
	}
	sf.add(cmd, "the scope to index into")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label of the scope when this makes it (repeat for more)")
	return cmd
}

func knowledgeUnwatchCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unwatch DIR",
		Short: "Stop keeping a directory indexed (what it indexed stays: keel knowledge forget DIR)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			return call(cmd, client.KnowledgeUnwatch, protocol.KnowledgeUnwatchParams{Dir: dir}, func(client.None) error {
				fmt.Fprintf(cmd.OutOrStdout(), "no longer watching %s\n", dir)
				return nil
			})
		},
	}
}

func knowledgeListCmd() *cobra.Command {
	var scope string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the scopes, their documents and the watched directories",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.KnowledgeList, protocol.KnowledgeListParams{Scope: scope}, func(r protocol.KnowledgeListResult) error {
				if asJSON {
					return writeJSON(cmd, r)
				}
				out := cmd.OutOrStdout()
				if len(r.Scopes) == 0 {
					fmt.Fprintln(out, "the knowledge store is empty; index something with: keel knowledge add PATH")
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				for _, s := range r.Scopes {
					fmt.Fprintf(tw, "%s\t%s\t%d docs\t%d chunks\t%s\n", s.Name, labelList(s.Labels), s.Docs, s.Chunks, formatBytes(s.Bytes))
				}
				tw.Flush()
				if len(r.Docs) > 0 {
					fmt.Fprintln(out)
				}
				tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				for _, d := range r.Docs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d chunks\n", d.ID, d.Source, d.Scope, d.Chunks)
				}
				tw.Flush()
				for _, w := range r.Watches {
					line := fmt.Sprintf("watching %s into %s", w.Dir, w.Scope)
					if w.Error != "" {
						line += " (not now: " + w.Error + ")"
					}
					fmt.Fprintln(out, line)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "only this scope")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result of knowledge.list as JSON")
	return cmd
}

// labelList shows labels as {a,b}, or - for none.
func labelList(labels []string) string {
	if len(labels) == 0 {
		return "-"
	}
	return "{" + strings.Join(labels, ",") + "}"
}

func knowledgeSearchCmd() *cobra.Command {
	var p protocol.KnowledgeSearchParams
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "search QUERY",
		Short: "Search the knowledge store: the best passages, each cited [n] source:lines",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Query = strings.Join(args, " ")
			return call(cmd, client.KnowledgeSearch, p, func(r protocol.KnowledgeSearchResult) error {
				if asJSON {
					return writeJSON(cmd, r)
				}
				out := cmd.OutOrStdout()
				if len(r.Hits) == 0 {
					fmt.Fprintln(out, "no match")
				}
				for _, h := range r.Hits {
					fmt.Fprintf(out, "%s  (%s %s, score %.4f)\n", h.Cite, h.Scope, labelList(h.Labels), h.Score)
					for _, line := range strings.Split(strings.TrimRight(h.Text, "\n"), "\n") {
						fmt.Fprintln(out, "    "+line)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringArrayVar(&p.Scopes, "scope", nil, "search only this scope (repeat for more; default: every scope)")
	cmd.Flags().IntVar(&p.Limit, "limit", 0, "how many hits (default 8, at most 100)")
	cmd.Flags().StringVar(&p.PathPrefix, "path-prefix", "", "only documents whose source starts with this")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result of knowledge.search as JSON")
	return cmd
}

func knowledgeForgetCmd() *cobra.Command {
	var scope string
	cmd := &cobra.Command{
		Use:   "forget PATH|ID | --scope SCOPE",
		Short: "Forget documents for good: a file, everything under a directory, one document, or a whole scope",
		Long: `Forget documents for good: their chunks, full-text entries and vectors are
deleted and the database file is rewritten so that they cannot be recovered
from it. PATH is a file or a directory (everything indexed under it); ID a
document's ID (keel knowledge list shows them).`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p protocol.KnowledgeForgetParams
			switch {
			case (scope == "") == (len(args) == 0):
				return &exitError{code: ExitUsage, err: fmt.Errorf("name a PATH or ID, or --scope (one)")}
			case scope != "":
				p.Scope = scope
			case !strings.ContainsRune(args[0], filepath.Separator) && !exists(args[0]):
				p.ID = args[0]
			default:
				abs, err := filepath.Abs(args[0])
				if err != nil {
					return err
				}
				p.Path = abs
			}
			return call(cmd, client.KnowledgeForget, p, func(r protocol.KnowledgeForgetResult) error {
				fmt.Fprintf(cmd.OutOrStdout(), "forgot %d documents\n", r.Forgotten)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "forget a whole scope")
	return cmd
}

func knowledgeLabelCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "label SCOPE [LABEL...]",
		Short: "Set a scope's labels (none: clear them); text retrieved from it carries them into a run",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, client.KnowledgeLabels, protocol.KnowledgeLabelsParams{Scope: args[0], Labels: append([]string{}, args[1:]...)}, func(s protocol.KnowledgeScope) error {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.Name, labelList(s.Labels))
				return nil
			})
		},
	}
}

// exists reports whether path names something on disk.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
