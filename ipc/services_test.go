package ipc_test

import (
	"slices"
	"testing"

	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestNilGroupNotServed: a nil group of ipc.Services is not served: its
// methods are missing from initialize and answer method not found, and
// the other groups still answer.
func TestNilGroupNotServed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		hide    func(*ipc.Services)
		methods []string
	}{
		{"runs", func(s *ipc.Services) { s.Runs = nil }, []string{protocol.MethodRunStart, protocol.MethodRunCancel, protocol.MethodRunSubscribe, protocol.MethodRunUnsubscribe}},
		{"history", func(s *ipc.Services) { s.History = nil }, []string{protocol.MethodRunList, protocol.MethodRunGet, protocol.MethodRunSubscribe}},
		{"tools", func(s *ipc.Services) { s.Tools = nil }, []string{protocol.MethodToolsList, protocol.MethodToolsCall}},
		{"admin", func(s *ipc.Services) { s.Admin = nil }, []string{protocol.MethodToolsInstall, protocol.MethodToolsGrant, protocol.MethodToolsRevoke, protocol.MethodToolsRemove, protocol.MethodToolsInspect}},
		{"audit", func(s *ipc.Services) { s.Audit = nil }, []string{protocol.MethodToolsAudit}},
		{"env", func(s *ipc.Services) { s.Env = nil }, []string{protocol.MethodEnvDescribe}},
		{"control and steering", func(*ipc.Services) {}, []string{protocol.MethodRunDecide, protocol.MethodRunReplay, protocol.MethodRunTakeOver, protocol.MethodRunFork}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := ipctest.Services(ipctest.New()) // the fake serves no run control or steering
			tt.hide(&svc)
			c := dial(t, startServer(t, svc, ipc.Config{}))
			var init protocol.InitializeResult
			c.callOK(protocol.MethodInitialize, nil, &init)
			for _, m := range tt.methods {
				if slices.Contains(init.Methods, m) {
					t.Errorf("initialize lists %s, want it not served", m)
				}
				if got := c.call(m, protocol.RunRef{RunID: "r"}); got.Error == nil || got.Error.Code != protocol.CodeMethodNotFound {
					t.Errorf("%s: error %+v, want code %d", m, got.Error, protocol.CodeMethodNotFound)
				}
			}
			if !slices.Contains(init.Methods, protocol.MethodModelsList) {
				t.Errorf("initialize lists %v, want models.list still served", init.Methods)
			}
		})
	}
}
