package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestBadFramesKeepDaemonAndData: malformed JSON, invalid params and an
// oversized frame, sent raw over the real WebSocket to the real daemon,
// each get their documented answer; the connection survives the first
// two, the daemon survives all three, and the run already stored in
// SQLite is untouched (no run is added by the refused requests).
func TestBadFramesKeepDaemonAndData(t *testing.T) {
	t.Parallel()
	d, _, run := startWithEndedRun(t, noTools(t))
	ctx := context.Background()
	info, err := client.ReadDaemonInfo(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, info.URL, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}},
		Subprotocols: []string{protocol.Subprotocol},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(-1)
	// exchange writes one frame and reads until the answer with an id
	// (notifications in between are skipped).
	exchange := func(frame string) (json.RawMessage, *protocol.Error) {
		t.Helper()
		if err := ws.Write(dctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatalf("write %.40q: %v", frame, err)
		}
		for {
			_, b, err := ws.Read(dctx)
			if err != nil {
				t.Fatalf("read the answer to %.40q: %v", frame, err)
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  *protocol.Error `json:"error"`
			}
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("answer %s: %v", b, err)
			}
			if len(m.ID) > 0 {
				return m.Result, m.Error
			}
		}
	}
	if _, e := exchange(`{"jsonrpc":"2.0","id":1,"method":`); e == nil || e.Code != protocol.CodeParseError {
		t.Errorf("malformed JSON: error %+v, want code %d", e, protocol.CodeParseError)
	}
	if _, e := exchange(`{"jsonrpc":"2.0","id":2,"method":"run.start","params":{"goal":5}}`); e == nil || e.Code != protocol.CodeInvalidParams {
		t.Errorf("run.start with a number for a goal: error %+v, want code %d", e, protocol.CodeInvalidParams)
	}
	if res, e := exchange(`{"jsonrpc":"2.0","id":3,"method":"run.get","params":{"run_id":"` + string(run.ID) + `"}}`); e != nil || !strings.Contains(string(res), `"succeeded"`) {
		t.Errorf("run.get on the same connection after bad frames: %s, %+v; want the run", res, e)
	}
	big := `{"jsonrpc":"2.0","id":4,"method":"run.start","params":{"goal":"` + strings.Repeat("x", protocol.MaxFrameBytes) + `"}}`
	_ = ws.Write(dctx, websocket.MessageText, []byte(big)) // may fail once the daemon has closed
	if _, _, err := ws.Read(dctx); websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Errorf("after an oversized frame: %v (status %d), want close status %d", err, websocket.CloseStatus(err), websocket.StatusMessageTooBig)
	}

	// The daemon still serves, and what it stored is intact.
	c2 := dial(t, d.dir)
	detail, err := c2.GetRun(ctx, run.ID)
	if err != nil || detail.Run.Status != keel.RunSucceeded || len(detail.Events) != 3 {
		t.Errorf("the earlier run after bad frames = %+v, %d events, %v", detail.Run, len(detail.Events), err)
	}
	runs, err := c2.ListRuns(ctx, 10)
	if err != nil || len(runs) != 1 {
		t.Errorf("runs after bad frames = %d, %v; want only the first (no refused request started one)", len(runs), err)
	}
}
