package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func mcpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the installed tools to an MCP client on stdin/stdout (the daemon must run)",
		Long: `keel mcp is an MCP server on stdin/stdout for clients that start their
servers as commands (Claude Desktop-style "command": "keel", "args": ["mcp"]).
It relays each message, unchanged, to the running daemon's MCP server
(streamable HTTP at /mcp, with the daemon's token), so it serves exactly
what /mcp serves: the installed tools, each call decided by the policy
(an ask becomes an MCP elicitation), with the tool's grants, limits and
the audit trail (which names the MCP client). Without a daemon it says
how to start one and exits 1. See docs/bridges.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := dataDir(cmd)
			// Dialling checks that the daemon runs, and says how to start
			// it if not.
			c, err := client.DialDataDir(cmd.Context(), dir)
			if err != nil {
				return err
			}
			c.Close()
			info, err := client.ReadDaemonInfo(dir)
			if err != nil {
				return err
			}
			tok, err := datadir.ReadToken(dir, info)
			if err != nil {
				return err
			}
			err = mcpserver.Relay(cmd.Context(), mcpserver.RelayConfig{URL: mcpURL(info), Token: tok}, cmd.InOrStdin(), cmd.OutOrStdout())
			if errors.Is(err, mcpserver.ErrSessionEnded) {
				return fmt.Errorf("keel mcp: %w", err)
			}
			if err != nil && cmd.Context().Err() == nil {
				return err
			}
			return nil
		},
	}
}

// mcpURL is the daemon's MCP endpoint: /mcp on the host of its
// WebSocket URL.
func mcpURL(info protocol.DaemonInfo) string {
	u := strings.TrimSuffix(info.URL, protocol.Path)
	u = strings.Replace(u, "ws://", "http://", 1)
	u = strings.Replace(u, "wss://", "https://", 1)
	return u + "/mcp"
}
