package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/keel-runtime/keel/capabilities"
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
			cloud := "off (allow_cloud in models.json)"
			if env.AllowCloud {
				cloud = "on, for runs that pass --allow-cloud and hold nothing private"
			}
			fmt.Fprintf(out, "\ncloud models  %s\n", cloud)
			approval := "none"
			if len(env.RequireApproval) > 0 {
				approval = strings.Join(env.RequireApproval, ", ") + " (tool calls of these side effects wait for keel approve/deny)"
			}
			fmt.Fprintf(out, "approval      %s\n", approval)
			if p := env.Policy; p != nil {
				files := "no policy files"
				if len(p.Files) > 0 {
					files = strings.Join(p.Files, ", ")
				}
				fmt.Fprintf(out, "policy        version %d: %s\n", p.Version, files)
				if p.Error != "" {
					fmt.Fprintf(out, "              BROKEN (the last good policy stays in force): %s\n", p.Error)
					healthy = false
				}
				for _, ws := range p.Workspaces {
					fmt.Fprintf(out, "              workspace %s: version %d\n", ws.Root, ws.Version)
					if ws.Error != "" {
						fmt.Fprintf(out, "              BROKEN (the runs in it keep the last good policy): %s\n", ws.Error)
						healthy = false
					}
				}
			}
			if t := env.Telemetry; t != nil {
				describeTelemetry(out, t)
			}
			l := env.ToolLimits
			fmt.Fprintf(out, "tool limits   %s per call, %d MiB memory, %s output, writes %s per grant leaving %s free, unload after %s idle, private network %s\n",
				msDuration(l.CallTimeoutMS), l.MemoryLimitMiB, formatBytes(int64(l.MaxOutputBytes)), limitBytes(l.WriteQuotaBytes), limitBytes(l.MinFreeDiskBytes),
				msDuration(l.IdleUnloadMS), map[bool]string{false: "refused", true: "allowed"}[l.AllowPrivateNetwork])
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

// describeTelemetry prints the export's state and counters.
func describeTelemetry(out io.Writer, t *capabilities.TelemetryState) {
	metrics := "metrics off"
	if t.Metrics {
		metrics = "metrics at GET /metrics (with the token)"
	}
	if !t.Export {
		fmt.Fprintf(out, "telemetry     export off (no endpoint in telemetry.json); %s\n", metrics)
		return
	}
	content := "no content"
	if t.Content {
		content = "content of unlabelled spans"
	}
	fmt.Fprintf(out, "telemetry     export %s to %s (%s, %s); %s\n", t.Protocol, t.Endpoint, t.File, content, metrics)
	fmt.Fprintf(out, "              spans: %d exported, %d dropped (queue full), %d failed, %d denied by policy; %d/%d queued\n",
		t.Exported, t.Dropped, t.Failed, t.Denied, t.Queued, t.QueueSize)
	if t.LastError != "" && t.LastErrorAt.After(t.LastExport) {
		fmt.Fprintf(out, "              FAILING since %s: %s\n", t.LastErrorAt.Format(time.RFC3339), t.LastError)
	}
}

// limitBytes renders a byte limit, negative meaning none.
func limitBytes(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return formatBytes(n)
}

// msDuration renders milliseconds as a duration, negative meaning never.
func msDuration(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String()
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
		fmt.Fprintf(out, "ollama    not reachable at %s: start it with `ollama serve` or set OLLAMA_HOST (keel needs it for runs, not for `keel tools call`)\n", host)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	fmt.Fprintf(out, "ollama    reachable at %s %s\n", host, strings.TrimSpace(string(body)))
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print keel's version, the commit it was built from and the protocol version it speaks (also: keel --version)",
		Args:  usageArgs(cobra.NoArgs),
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
		},
	}
}
