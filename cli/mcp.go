package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func mcpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the installed tools to an MCP client on stdin/stdout (the daemon must run)",
		Long: `keel mcp is an MCP server on stdin/stdout for clients that start their
servers as commands (Claude Desktop-style "command": "keel", "args": ["mcp"]).
It connects to the running daemon of the data directory and serves its
installed tools: every call is the daemon's tools.call, with the tool's
grants, limits, the policy and the audit trail (which names the MCP
client). Without a daemon it says how to start one and exits 1.
The daemon also serves MCP over streamable HTTP at /mcp (docs/bridges.md).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client.DialDataDir(cmd.Context(), dataDir(cmd))
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Initialize(cmd.Context(), protocol.InitializeParams{Client: "keel-mcp"}); err != nil {
				return err
			}
			// The connection's end (the daemon stopped) ends the server.
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				for range c.Events() {
				}
				cancel()
			}()
			tools := &daemonTools{c: c, done: ctx.Done()}
			srv, err := mcpserver.New(ctx, mcpserver.Config{Tools: tools, Version: versionLine()})
			if err != nil {
				return err
			}
			defer srv.Close()
			err = srv.Run(ctx, &sdk.IOTransport{Reader: nopCloser{cmd.InOrStdin()}, Writer: nopWriteCloser{cmd.OutOrStdout()}})
			if cerr := c.Err(); cerr != nil && cmd.Context().Err() == nil {
				return fmt.Errorf("the connection to the daemon ended: %w", cerr)
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
}

// daemonTools are the daemon's tools over keel's protocol: tools.list,
// tools.call and the tools.changed notification.
type daemonTools struct {
	c    *client.Client
	done <-chan struct{} // ends the watch of tools.changed
	mu   sync.Mutex
	subs map[int]func()
	next int
	once sync.Once
}

func (d *daemonTools) ListTools(ctx context.Context) ([]capabilities.ToolInfo, error) {
	return d.c.ListTools(ctx)
}

// CallTool is tools.call; the daemon's tool errors come back as
// *keel.ToolError.
func (d *daemonTools) CallTool(ctx context.Context, name string, input json.RawMessage, who string) (json.RawMessage, error) {
	res, err := client.Do(ctx, d.c, client.ToolsCall, protocol.ToolsCallParams{Name: name, Input: input, Client: who})
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && len(pe.Data) > 0 {
			switch pe.Code {
			case protocol.CodeToolError, protocol.CodeInvalidToolInput, protocol.CodeNotFound:
				var te keel.ToolError
				if json.Unmarshal(pe.Data, &te) == nil && te.Code != "" {
					return nil, &te
				}
			}
		}
		return nil, err
	}
	return res.Output, nil
}

// SubscribeTools calls fn on each tools.changed of the connection.
func (d *daemonTools) SubscribeTools(fn func()) (cancel func()) {
	d.mu.Lock()
	if d.subs == nil {
		d.subs = map[int]func(){}
	}
	id := d.next
	d.next++
	d.subs[id] = fn
	d.mu.Unlock()
	d.once.Do(func() {
		go func() {
			for {
				select {
				case <-d.done:
					return
				case <-d.c.ToolsChanged():
				}
				d.mu.Lock()
				for _, f := range d.subs {
					f()
				}
				d.mu.Unlock()
			}
		}()
	})
	return func() {
		d.mu.Lock()
		delete(d.subs, id)
		d.mu.Unlock()
	}
}

// nopCloser and nopWriteCloser let the MCP transport end without closing
// the command's stdin and stdout.
type nopCloser struct{ io.Reader }

func (nopCloser) Close() error { return nil }

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
