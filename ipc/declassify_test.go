package ipc_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// labelled is the fake backend with the RunLabels group: it records the
// declassifications it is asked for.
type labelled struct {
	*ipctest.Backend
	mu    sync.Mutex
	asked []keel.DeclassifyRequest
}

func (l *labelled) ContextLabels(context.Context, keel.RunID) ([]string, error) {
	return []string{"pii"}, nil
}

// requests returns the declassifications asked for so far.
func (l *labelled) requests() []keel.DeclassifyRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]keel.DeclassifyRequest(nil), l.asked...)
}

func (l *labelled) Declassify(_ context.Context, req keel.DeclassifyRequest) (keel.DeclassifyData, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, req)
	return keel.DeclassifyData{Label: req.Label, By: req.By, Reason: req.Reason}, nil
}

// TestRunDeclassifyParams: run.declassify's params are checked before
// the backend is asked (unknown and mistyped fields, a malformed label,
// a blank reason or by, each naming its field), who defaults to the
// client's initialize name per connection, else "user"; and run.get
// carries the context's labels.
func TestRunDeclassifyParams(t *testing.T) {
	b := &labelled{Backend: ipctest.New()}
	b.AddRun("r1", keel.RunRunning)
	ts := startServer(t, b, ipc.Config{})
	c := dial(t, ts)
	for _, tt := range []struct {
		name   string
		params any
		field  string
	}{
		{"unknown field", map[string]any{"run_id": "r1", "label": "pii", "reason": "r", "colour": "red"}, "colour"},
		{"label a number", map[string]any{"run_id": "r1", "label": 7, "reason": "r"}, "label"},
		{"no run", map[string]any{"label": "pii", "reason": "r"}, "run_id"},
		{"no label", map[string]any{"run_id": "r1", "reason": "r"}, "label"},
		{"malformed label", map[string]any{"run_id": "r1", "label": "PII", "reason": "r"}, "label"},
		{"blank reason", map[string]any{"run_id": "r1", "label": "pii", "reason": " \t"}, "reason"},
		{"blank by", map[string]any{"run_id": "r1", "label": "pii", "reason": "r", "by": " "}, "by"},
	} {
		m := c.call(protocol.MethodRunDeclassify, tt.params)
		if m.Error == nil || m.Error.Code != protocol.CodeInvalidParams || !strings.Contains(string(m.Error.Data), `"`+tt.field+`"`) {
			t.Errorf("%s: response %s error %+v, want invalid params naming %s", tt.name, m.Result, m.Error, tt.field)
		}
	}
	if asked := b.requests(); len(asked) != 0 {
		t.Fatalf("the backend was asked %+v after bad params", asked)
	}

	var res protocol.RunDeclassifyResult
	c.callOK(protocol.MethodRunDeclassify, protocol.RunDeclassifyParams{RunID: "r1", Label: "pii", Reason: "r"}, &res)
	c.callOK(protocol.MethodInitialize, protocol.InitializeParams{Client: "ide/2"}, nil)
	c.callOK(protocol.MethodRunDeclassify, protocol.RunDeclassifyParams{RunID: "r1", Label: "pii", Reason: "r"}, &res)
	c.callOK(protocol.MethodRunDeclassify, protocol.RunDeclassifyParams{RunID: "r1", Label: "pii", Reason: "r", By: "ada"}, &res)
	other := dial(t, ts) // another connection has a name of its own
	other.callOK(protocol.MethodRunDeclassify, protocol.RunDeclassifyParams{RunID: "r1", Label: "pii", Reason: "r"}, &res)
	var by []string
	for _, r := range b.requests() {
		by = append(by, r.By)
	}
	if got, want := strings.Join(by, ","), "user,ide/2,ada,user"; got != want {
		t.Errorf("declassified by %s, want %s", got, want)
	}

	var d protocol.RunDetail
	c.callOK(protocol.MethodRunGet, protocol.RunRef{RunID: "r1"}, &d)
	if strings.Join(d.Labels, ",") != "pii" {
		t.Errorf("run.get labels = %v, want [pii]", d.Labels)
	}
}
