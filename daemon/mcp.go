package daemon

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc"
)

// MCPPath is where the daemon serves MCP over streamable HTTP.
const MCPPath = "/mcp"

// mcpRoute serves the installed tools to MCP clients at MCPPath: the
// same direct call as tools.call (tools), behind the WebSocket's token,
// Origin and Host checks (a non-public route), with the scopes of each
// caller checked per MCP method. stop ends its sessions.
func mcpRoute(ctx context.Context, tools mcpserver.Tools, log *slog.Logger) (rt ipc.Route, stop func(), err error) {
	srv, err := mcpserver.New(ctx, mcpserver.Config{Tools: tools, Version: Version, Logger: log.With(logkey.Component, "mcp")})
	if err != nil {
		return ipc.Route{}, nil, err
	}
	h := srv.HTTPHandler(mcpserver.HTTPConfig{Caller: func(r *http.Request) (mcpserver.Caller, bool) {
		who, ok := ipc.CallerOf(r)
		if !ok {
			return mcpserver.Caller{}, false
		}
		return mcpserver.Caller{ID: who.Via + ":" + who.Name, Scopes: who.Scopes}, true
	}})
	return ipc.Route{Pattern: MCPPath, Handler: h}, srv.Close, nil
}
