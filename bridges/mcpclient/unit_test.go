package mcpclient_test

import (
	"errors"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpclient"
)

func TestClass(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	for _, tc := range []struct {
		name string
		a    *sdk.ToolAnnotations
		want keel.SideEffect
	}{
		{"no annotations", nil, keel.SideEffectExternal},
		{"no hints", &sdk.ToolAnnotations{Title: "t"}, keel.SideEffectExternal},
		{"read-only", &sdk.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &no}, keel.SideEffectReadOnly},
		{"idempotent", &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: &yes}, keel.SideEffectIdempotentWrite},
		{"destructive", &sdk.ToolAnnotations{DestructiveHint: &yes}, keel.SideEffectNonIdempotentWrite},
		{"additive, closed world", &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}, keel.SideEffectNonIdempotentWrite},
		{"open world", &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &yes}, keel.SideEffectExternal},
	} {
		if got := mcpclient.Class(tc.a); got != tc.want {
			t.Errorf("Class(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestToolName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		server, remote, want string
		ok                   bool
	}{
		{"everything", "get-sum", "mcp-everything-get-sum", true},
		{"fs", "files.read/all", "mcp-fs-files_read_all", true},
		{"s", "", "mcp-s-", false},
		{"s", string(make([]byte, 60)), "", false},
	} {
		got, ok := mcpfile.ToolName(tc.server, tc.remote)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("ToolName(%q, %q) = %q, %v, want %q, %v", tc.server, tc.remote, got, ok, tc.want, tc.ok)
		}
		if ok {
			if s, isMCP := mcpfile.IsToolName(got); !isMCP || s != tc.server {
				t.Errorf("IsToolName(%q) = %q, %v, want %q", got, s, isMCP, tc.server)
			}
		}
	}
	if _, ok := mcpfile.IsToolName("wordcount"); ok {
		t.Error("IsToolName(wordcount) = true: an installed tool's name is no MCP tool's")
	}
}

func TestServerConfigCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    mcpfile.ServerConfig
	}{
		{"Bad", mcpfile.ServerConfig{URL: "http://x"}},
		{"has-dash", mcpfile.ServerConfig{URL: "http://x"}},
		{"none", mcpfile.ServerConfig{}},
		{"both", mcpfile.ServerConfig{URL: "http://x", Command: []string{"x"}}},
		{"scheme", mcpfile.ServerConfig{URL: "file:///etc/passwd"}},
		{"nohost", mcpfile.ServerConfig{URL: "http://"}},
		{"emptycmd", mcpfile.ServerConfig{Command: []string{""}}},
		{"stdioheaders", mcpfile.ServerConfig{Command: []string{"x"}, Headers: map[string]string{"A": "b"}}},
		{"httpenv", mcpfile.ServerConfig{URL: "http://x", Env: map[string]string{"A": "b"}}},
		{"badheader", mcpfile.ServerConfig{URL: "http://x", Headers: map[string]string{"A B": "c"}}},
		{"badenv", mcpfile.ServerConfig{Command: []string{"x"}, Env: map[string]string{"A=B": "c"}}},
		{"badlabel", mcpfile.ServerConfig{URL: "http://x", Labels: []string{"Not A Label"}}},
		{"timeout", mcpfile.ServerConfig{URL: "http://x", TimeoutSeconds: -1}},
	} {
		if err := tc.c.Check(tc.name); !errors.Is(err, keel.ErrInvalid) && !(tc.name == "badlabel" && err != nil) {
			t.Errorf("Check(%s, %+v) = %v, want an error wrapping keel.ErrInvalid", tc.name, tc.c, err)
		}
	}
	ok := mcpfile.ServerConfig{Command: []string{"node", "server.js"}, Env: map[string]string{"K": "v"}}
	if err := ok.Check("good_1"); err != nil {
		t.Errorf("Check(good_1) = %v", err)
	}
	if ok.Granted() {
		t.Error("a stdio server with no grant is granted")
	}
	ok.NativeGrant = mcpfile.NativeDigest(ok)
	if !ok.Granted() {
		t.Error("a stdio server granted its command is not granted")
	}
	ok.Env["K"] = "changed"
	if ok.Granted() {
		t.Error("a stdio server whose environment changed after the grant is still granted")
	}
}
