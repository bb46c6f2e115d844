package cli

import (
	"fmt"
	"os/exec"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func openCmd() *cobra.Command {
	var printOnly bool
	cmd := &cobra.Command{
		Use:   "open",
		Short: "Open the web console in your browser, logged in with a one-time link",
		Long: `open asks the daemon for a one-time login link to its web console, prints it
and, when standard output is a terminal and this system has a way to open a
URL (xdg-open, open, rundll32), opens it in your browser.

The link works once, for 60 seconds; it logs the browser in with a session
cookie that lasts until it has not been used for 12 hours, 7 days at most,
or until the daemon restarts. Run 'keel open' again for a new one.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, client.ConsoleLogin, client.None{}, func(r protocol.ConsoleLoginResult) error {
				fmt.Fprintln(cmd.OutOrStdout(), r.URL)
				note := fmt.Sprintf("this link logs a browser in to keel once, within %s", time.Until(r.ExpiresAt).Round(time.Second))
				if name, args, ok := opener(runtime.GOOS, exec.LookPath); ok && !printOnly && isTerminal(cmd.OutOrStdout()) {
					p := exec.Command(name, append(args, r.URL)...)
					if err := p.Start(); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "could not open a browser (%v): open the link above; %s\n", err, note)
						return nil
					}
					p.Process.Release() // the browser outlives keel open
					fmt.Fprintf(cmd.ErrOrStderr(), "opening it in your browser; %s\n", note)
					return nil
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "open it in your browser: %s\n", note)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&printOnly, "print", false, "only print the link, do not open a browser")
	return cmd
}

// opener returns the command that opens a URL in the user's browser on
// goos (the URL is its last argument), if lookPath finds it.
func opener(goos string, lookPath func(string) (string, error)) (name string, args []string, ok bool) {
	switch goos {
	case "darwin":
		name = "open"
	case "windows":
		name, args = "rundll32", []string{"url.dll,FileProtocolHandler"}
	default:
		name = "xdg-open"
	}
	if _, err := lookPath(name); err != nil {
		return "", nil, false
	}
	return name, args, true
}
