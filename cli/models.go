package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func modelsCmd() *cobra.Command {
	cmd := group(&cobra.Command{Use: "models", Short: "Models of the daemon's model providers"})
	cmd.AddCommand(modelsListCmd(), modelsPullCmd())
	return cmd
}

func modelsListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the models of every model provider with capabilities, context length and size",
		Long: `List the models of every model provider with capabilities, context length and size.

Exits 1 when a provider cannot be reached, after saying what to do about it.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.ModelsList, client.None{}, func(res protocol.ModelsListResult) error {
				healthy, errw := true, cmd.ErrOrStderr()
				for _, p := range res.Providers {
					switch {
					case !p.Reachable:
						healthy = false
						fmt.Fprintf(errw, "provider %s (%s) unreachable: %s\n", p.Name, p.Endpoint, p.Error)
						if p.Hint != "" {
							fmt.Fprintf(errw, "  do: %s\n", p.Hint)
						}
					case p.Hint != "":
						fmt.Fprintf(errw, "provider %s: %s\n", p.Name, p.Hint)
					}
				}
				if asJSON {
					if err := writeJSON(cmd, res); err != nil {
						return err
					}
				} else if len(res.Models) > 0 {
					tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tPROVIDER\tCAPABILITIES\tCONTEXT\tSIZE")
					for _, m := range res.Models {
						ctxLen := "-"
						if m.ContextLength > 0 {
							ctxLen = strconv.Itoa(m.ContextLength)
						}
						size := "-"
						if m.Size > 0 {
							size = formatBytes(m.Size)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Provider, strings.Join(m.Capabilities, ","), ctxLen, size)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
				}
				if !healthy {
					return &exitError{code: ExitFailure}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func modelsPullCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pull NAME",
		Short: "Download a model (such as qwen2.5:0.5b) into Ollama with a progress bar; Ctrl-C cancels it",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			c, err := connect(cmd)
			if err != nil {
				return err
			}
			// Closing the connection is what cancels a pull in flight.
			defer c.Close()
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			pr := newProgress(out, isTerminal(out), true)
			_, err = c.PullModel(ctx, name, func(p protocol.ModelsPullProgress) { pr.set(p.Status, p.Completed, p.Total) })
			pr.end()
			if err != nil {
				if errors.Is(err, context.Canceled) && ctx.Err() != nil {
					return &exitError{code: ExitCancelled, err: fmt.Errorf("pull of %s cancelled", name)}
				}
				return err
			}
			fmt.Fprintf(out, "pulled %s\n", name)
			return nil
		},
	}
}

// formatBytes renders n bytes in decimal units, as Ollama does: "512 B",
// "1.5 MB", "4.7 GB".
func formatBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTP"[exp])
}
