package daemon

import (
	"github.com/keel-runtime/keel/console"
	"github.com/keel-runtime/keel/ipc"
)

// consoleRoutes serves the web console's pages beside the WebSocket.
// They are public: they hold no data, and everything they show comes
// over the WebSocket, which needs a login.
func consoleRoutes() []ipc.Route {
	h := console.Handler()
	routes := make([]ipc.Route, 0, len(console.Patterns))
	for _, p := range console.Patterns {
		routes = append(routes, ipc.Route{Pattern: p, Handler: h, Public: true})
	}
	return routes
}
