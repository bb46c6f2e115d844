package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/capabilities"
)

func TestAnnotations(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	tests := []struct {
		class   keel.SideEffect
		network bool
		want    sdk.ToolAnnotations
	}{
		{keel.SideEffectReadOnly, false, sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &no, OpenWorldHint: &no}},
		{keel.SideEffectReadOnly, true, sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &no, OpenWorldHint: &yes}},
		{keel.SideEffectIdempotentWrite, false, sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: &yes, OpenWorldHint: &no}},
		{keel.SideEffectNonIdempotentWrite, false, sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no}},
		{keel.SideEffectExternal, false, sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}},
		{"", false, sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(&tt.want, mcpserver.Annotations(tt.class, tt.network)); diff != "" {
			t.Errorf("Annotations(%q, network %v) (-want +got):\n%s", tt.class, tt.network, diff)
		}
	}
}

func TestToolNeedsObjectSchema(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{`{"type":"string"}`, `{}`, ``, `{"type":["object","null"]}`} {
		_, err := mcpserver.Tool(capabilities.ToolInfo{ToolSpec: keel.ToolSpec{Name: "t", InputSchema: json.RawMessage(schema)}})
		if !errors.Is(err, mcpserver.ErrNotObject) {
			t.Errorf("Tool(input schema %s) = %v, want ErrNotObject", schema, err)
		}
	}
	tl, err := mcpserver.Tool(capabilities.ToolInfo{ToolSpec: keel.ToolSpec{Name: "t", InputSchema: json.RawMessage(`{"type":"object"}`),
		OutputSchema: json.RawMessage(`{"type":"string"}`)}})
	if err != nil || tl.OutputSchema != nil {
		t.Errorf("Tool(output schema of a string) = %+v, %v; want no outputSchema (MCP's are objects')", tl, err)
	}
}

// fakeTools is a Tools whose subscription is observable.
type fakeTools struct {
	mu   sync.Mutex
	subs int
}

func (f *fakeTools) ListTools(context.Context) ([]capabilities.ToolInfo, error) { return nil, nil }
func (f *fakeTools) CallTool(context.Context, mcpserver.Call) (json.RawMessage, error) {
	return nil, errors.New("no tools")
}
func (f *fakeTools) SubscribeTools(func()) func() {
	f.mu.Lock()
	f.subs++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.subs--
		f.mu.Unlock()
	}
}

// TestCloseEndsSubscription: Close ends the server's subscription to the
// tools and may be called twice.
func TestCloseEndsSubscription(t *testing.T) {
	t.Parallel()
	f := &fakeTools{}
	s, err := mcpserver.New(context.Background(), mcpserver.Config{Tools: f})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if f.subs != 0 {
		t.Errorf("after Close, %d subscriptions to the tools remain", f.subs)
	}
	if _, err := mcpserver.New(context.Background(), mcpserver.Config{}); err == nil {
		t.Error("New without Tools succeeded")
	}
}
