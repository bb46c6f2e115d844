package daemon

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/wasmtools"
)

// CompileChild runs this process as a tool compile child if it was
// started as one (wasmtools.IsCompileChild), and then returns its exit
// code and true; otherwise it returns false at once. The main of a
// binary that runs Command calls it first: Command's daemon compiles its
// tools in children of its own executable.
func CompileChild(ctx context.Context) (code int, ok bool) {
	if !wasmtools.IsCompileChild() {
		return 0, false
	}
	return wasmtools.CompileChildMain(ctx, os.Stdin, os.Stdout), true
}

// Command returns the `keel daemon` command, which runs Run with flags.
func Command() *cobra.Command {
	var cfg Config
	var verbose bool
	var approve []string
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Start the keel runtime (listens on loopback; Ctrl-C stops it)",
		Long: `Start the keel runtime.

The daemon keeps its database, tools and access token in the data directory
and writes DATA_DIR/daemon.json once it accepts connections, so clients
(the keel CLI, IDE extensions, browser pages) can find it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir, _ := cmd.Flags().GetString("data-dir"); dir != "" {
				cfg.DataDir = dir
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			// Tools compile in children of this very binary, whose
			// main runs CompileChild first.
			if exe, err := os.Executable(); err == nil {
				cfg.ToolsCompiler = &wasmtools.Compiler{Path: exe}
			}
			for _, a := range approve {
				cfg.RequireApproval = append(cfg.RequireApproval, keel.SideEffect(a))
			}
			return Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", DefaultAddr, "listen address HOST:PORT (port 0 picks a free port)")
	f.BoolVar(&cfg.AllowNonLoopback, "allow-non-loopback", false, "allow a non-loopback --addr (other machines could connect)")
	f.StringSliceVar(&cfg.AllowedOrigins, "allow-origin", nil, "browser origin allowed to connect with a token: exact (http://localhost:5173) or a pattern (http://localhost:*, https://*.example.com, vscode-webview://*); repeatable")
	f.StringVar(&cfg.OllamaHost, "ollama-host", os.Getenv("OLLAMA_HOST"), "Ollama server (default $OLLAMA_HOST or http://127.0.0.1:11434)")
	f.StringVar(&cfg.DefaultModel, "model", "", "default model for runs (default: the first local model with tool calling)")
	f.StringVar(&cfg.EmbedModel, "embed-model", "", "local model that embeds the knowledge store for hybrid search, such as nomic-embed-text (default: none, full-text search only)")
	f.StringVar(&cfg.Workspace, "workspace", "", "directory the example read-file tool may read, at /workspace (default DATA_DIR/workspace)")
	f.BoolVar(&cfg.ToolsAllowPrivateNetwork, "tools-allow-private-network", false, "let tools with network grants reach loopback and private addresses")
	f.Int64Var(&cfg.ToolsWriteQuotaBytes, "tools-write-quota", 0, "bytes one tool call may write through each read-write grant (default 1 GiB; negative: no quota)")
	f.Int64Var(&cfg.ToolsMinFreeDiskBytes, "tools-min-free-disk", 0, "free disk, in bytes, a tool's write must leave (default 1 GiB; negative: no floor)")
	f.DurationVar(&cfg.ToolsIdleTimeout, "tools-idle-timeout", 0, "unload a tool's compiled code after this long without calls; the next call loads it from the cache (default 5m; negative: never)")
	f.StringSliceVar(&approve, "require-approval", nil, "side-effect classes whose tool calls wait for your approval: non_idempotent_write, external, idempotent_write, read_only (comma-separated)")
	f.StringVar(&cfg.Join, "join", "", "join a keel cloud as an edge: its leaf node URL(s), nats-leaf://HOST:PORT (docs/cloud.md)")
	f.StringVar(&cfg.JoinCredentials, "credentials", "", "file of credentials for --join: a NATS .creds file, or user:password, or a token")
	f.StringVar(&cfg.EdgeName, "edge-name", "", "this edge's name in the cloud (default: the host name)")
	f.StringSliceVar(&cfg.EdgeAllowLabels, "edge-allow-label", nil, "labels whose data may cross to the cloud (never private; default none)")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
