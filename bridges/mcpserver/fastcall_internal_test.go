package mcpserver

import "testing"

// TestParseDirect: the direct path takes a plain tools/call only, with
// keys matched exactly; everything else is left to the SDK.
func TestParseDirect(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		body       string
		ok         bool
		name, args string
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"a"}}}`, true, "wordcount", `{"text":"a"}`},
		{`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"wordcount"}}`, true, "wordcount", `{}`},
		{`{"jsonrpc":"2.0","id":-1,"method":"tools/call","params":{"name":"wordcount","arguments":null}}`, true, "wordcount", `{}`},
		{`[{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wordcount"}}]`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"Method":"tools/call","params":{"name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"1.0","id":7,"method":"tools/call","params":{"name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wordcount","_meta":{"progressToken":1}}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wordcount","arguments":{},"_meta":{}}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wordcount"},"extra":1}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":""}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"Name":"wordcount"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":[]}`, false, "", ""},
		{`not json`, false, "", ""},
	} {
		c, ok := parseDirect([]byte(tt.body))
		if ok != tt.ok || ok && (c.name != tt.name || string(c.args) != tt.args) {
			t.Errorf("parseDirect(%s) = %q, %s, %v; want %q, %s, %v", tt.body, c.name, c.args, ok, tt.name, tt.args, tt.ok)
		}
	}
}
