package client_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestDoNone: a call whose params are client.None sends no params
// member, and a result typed client.None is not decoded, whatever the
// daemon answers. A raw WebSocket peer shows the frames as sent.
func TestDoNone(t *testing.T) {
	t.Parallel()
	frames := make(chan map[string]json.RawMessage, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{protocol.Subprotocol}})
		if err != nil {
			t.Error(err)
			return
		}
		defer ws.CloseNow()
		for {
			_, data, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			var req map[string]json.RawMessage
			if err := json.Unmarshal(data, &req); err != nil {
				t.Error(err)
				return
			}
			frames <- req
			// A result no method's type decodes: only a result typed
			// None can take it.
			resp := `{"jsonrpc":"2.0","id":` + string(req["id"]) + `,"result":true}`
			if err := ws.Write(r.Context(), websocket.MessageText, []byte(resp)); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	c, err := client.Dial(ctx5s(t), "ws"+strings.TrimPrefix(srv.URL, "http"), testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if _, err := client.Do(ctx5s(t), c, client.RunUnsubscribe, protocol.RunRef{RunID: "r1"}); err != nil {
		t.Errorf("Do(run.unsubscribe) with result true = %v, want nil (a None result is not decoded)", err)
	}
	if req := <-frames; string(req["method"]) != `"run.unsubscribe"` || string(req["params"]) != `{"run_id":"r1"}` {
		t.Errorf("run.unsubscribe sent method %s params %s", req["method"], req["params"])
	}
	if _, err := client.Do(ctx5s(t), c, client.ToolsList, client.None{}); err == nil {
		t.Error("Do(tools.list) with result true = nil error, want a decode error")
	}
	if req := <-frames; string(req["method"]) != `"tools.list"` || req["params"] != nil {
		t.Errorf("tools.list sent method %s params %s, want no params", req["method"], req["params"])
	}
}
