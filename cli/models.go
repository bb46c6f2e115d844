package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func modelsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "models", Short: "Models of the daemon's model providers"}
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
			return withClient(cmd, func(c *client.Client) error {
				res, err := c.ListModels(cmd.Context())
				if err != nil {
					return err
				}
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
			pr := &pullPrinter{w: out, terminal: isTerminal(out)}
			_, err = c.PullModel(ctx, name, pr.print)
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

// pullPrinter renders a pull's progress. On a terminal it keeps one line,
// redrawn in place: the status, then for a layer download its percentage,
// a bar and the bytes done of the total. Elsewhere (a pipe, a file, a
// log) it prints one line each time the status changes.
type pullPrinter struct {
	w        io.Writer
	terminal bool
	status   string // the last status shown
	drawn    bool   // a terminal line is open
}

// barWidth is the width of the progress bar in cells.
const barWidth = 24

func (p *pullPrinter) print(pr protocol.ModelsPullProgress) {
	if !p.terminal {
		if pr.Status == p.status {
			return
		}
		p.status = pr.Status
		if pr.Total > 0 {
			fmt.Fprintf(p.w, "%s (%s)\n", pr.Status, formatBytes(pr.Total))
		} else {
			fmt.Fprintln(p.w, pr.Status)
		}
		return
	}
	line := pr.Status
	if pr.Total > 0 {
		done := min(max(pr.Completed, 0), pr.Total)
		filled := int(done * barWidth / pr.Total)
		line = fmt.Sprintf("%-22s %3d%% [%s%s] %s/%s", clip(pr.Status, 22), done*100/pr.Total,
			strings.Repeat("=", filled), strings.Repeat(" ", barWidth-filled), formatBytes(done), formatBytes(pr.Total))
	}
	// \r returns to the line's start; \x1b[K clears what a longer line
	// left behind.
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	p.drawn = true
}

// end closes the terminal line, if one is open.
func (p *pullPrinter) end() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// isTerminal reports whether w is a terminal: a character device, as
// terminals are (and /dev/null, where what is drawn does not matter).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
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
