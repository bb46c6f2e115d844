package ipc_test

import (
	"sync"
	"testing"

	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// notifyingBackend is an ipctest.Backend whose tools can be said to have
// changed (ipc.Tools.SubscribeTools), as the daemon's are by install, removal
// and hot reload.
type notifyingBackend struct {
	*ipctest.Backend
	mu   sync.Mutex
	subs []func()
	subd chan struct{} // closed once the server has subscribed
}

func (b *notifyingBackend) SubscribeTools(fn func()) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs = append(b.subs, fn)
	close(b.subd)
	return func() {}
}

func (b *notifyingBackend) changed() {
	b.mu.Lock()
	subs := append([]func(){}, b.subs...)
	b.mu.Unlock()
	for _, fn := range subs {
		fn()
	}
}

// TestToolsChangedReachesEveryClient: a change of the installed tools is
// a tools.changed notification on every open connection.
func TestToolsChangedReachesEveryClient(t *testing.T) {
	t.Parallel()
	b := &notifyingBackend{Backend: ipctest.New(), subd: make(chan struct{})}
	var _ ipc.Tools = b
	ts := startServer(t, b, ipc.Config{})
	c1, c2 := dial(t, ts), dial(t, ts)
	// A round trip on each makes sure both connections are registered.
	c1.call("tools.list", nil)
	c2.call("tools.list", nil)
	<-b.subd
	b.changed()
	for i, c := range []*tclient{c1, c2} {
		if m := c.read(); m.Method != protocol.NotifyToolsChanged {
			t.Errorf("client %d got %+v, want a %s notification", i+1, m, protocol.NotifyToolsChanged)
		}
	}
}

// TestCheckOrigins: the daemon checks --allow-origin before any slow
// work; a value that is not a bare scheme://host[:port] is refused,
// naming it.
func TestCheckOrigins(t *testing.T) {
	t.Parallel()
	if err := ipc.CheckOrigins([]string{"http://localhost:5173", "https://Example.com", "vscode-webview://abc"}); err != nil {
		t.Errorf("CheckOrigins(valid): %v", err)
	}
	for _, bad := range []string{"localhost:5173", "http://host/path", "http://u@host", "http://host?q=1", "http://host#f", "://"} {
		if err := ipc.CheckOrigins([]string{"http://ok.example", bad}); err == nil {
			t.Errorf("CheckOrigins(%q) = nil, want an error", bad)
		}
	}
}
