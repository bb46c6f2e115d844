package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

func doctorCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show what this environment declares: model providers, models, tools, grants, data dir, daemon URL",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			dir := dataDir(cmd)
			c, err := connect(cmd)
			if err != nil {
				fmt.Fprintf(out, "data dir  %s\ndaemon    not running: %s\n", dir, describe(err))
				fmt.Fprintf(out, "          start it with: keel daemon --data-dir %s\n", dir)
				probeOllama(cmd.Context(), out)
				return &exitError{code: ExitFailure}
			}
			defer c.Close()
			env, err := c.Describe(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd, env)
			}
			fmt.Fprintf(out, "keel %s  protocol %s\ndata dir  %s\ndaemon    %s (network: %s)\n", env.Version, env.Protocol, env.DataDir, env.URL, env.Network)
			if env.DefaultModel != "" {
				fmt.Fprintf(out, "default model  %s\n", env.DefaultModel)
			}
			healthy := true
			for _, p := range env.Providers {
				state := "reachable"
				if !p.Reachable {
					state, healthy = "UNREACHABLE", false
				}
				fmt.Fprintf(out, "\nprovider  %s (%s) %s  %s\n", p.Name, p.Kind, p.Endpoint, state)
				if p.Error != "" {
					fmt.Fprintf(out, "          error: %s\n", p.Error)
				}
				if p.Hint != "" {
					fmt.Fprintf(out, "          do: %s\n", p.Hint)
				}
				for _, m := range p.Models {
					ctxLen := "context unknown"
					if m.ContextLength > 0 {
						ctxLen = fmt.Sprintf("context %d", m.ContextLength)
					}
					fmt.Fprintf(out, "  model   %-28s %-16s [%s]\n", m.Name, ctxLen, strings.Join(m.Capabilities, " "))
				}
			}
			if env.ToolsCompiling > 0 {
				fmt.Fprintf(out, "\ntools (%d, and %d still compiling: `keel tools list` shows progress)\n", len(env.Tools), env.ToolsCompiling)
			} else {
				fmt.Fprintf(out, "\ntools (%d)\n", len(env.Tools))
			}
			for _, t := range env.Tools {
				fmt.Fprintf(out, "  %-12s %-8s %-20s grants: %s\n", t.Name, t.Version, t.SideEffects, grantsLine(t.Grants))
				describePending(out, "    ", t.Name, t.GrantDigest, t.PendingGrants)
			}
			if !healthy {
				return &exitError{code: ExitFailure}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// probeOllama reports whether Ollama answers, for when no daemon can be asked.
func probeOllama(ctx context.Context, out io.Writer) {
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		host = "127.0.0.1:11434"
	}
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(host, "/")+"/api/version", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(out, "ollama    not reachable at %s: start it with `ollama serve` or set OLLAMA_HOST (keel needs it for runs, not for `keel tool call`)\n", host)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	fmt.Fprintf(out, "ollama    reachable at %s %s\n", host, strings.TrimSpace(string(body)))
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the protocol version this CLI speaks",
		Args:  usageArgs(cobra.NoArgs),
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "keel CLI, protocol %s\n", protocol.Version)
		},
	}
}
