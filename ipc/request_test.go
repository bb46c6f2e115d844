package ipc

import (
	"encoding/json"
	"testing"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// FuzzParseRequest checks that any frame either parses into a request
// the dispatcher can rely on or yields one of the request-level error
// codes, and that the params decoder never panics.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"run.start","params":{"goal":"g","max_steps":2}}`,
		`{"jsonrpc":"2.0","method":"run.cancel","params":{"run_id":"r"}}`,
		`{"jsonrpc":"2.0","id":"x","method":"run.list","params":[1]}`,
		`{"jsonrpc":"2.0","id":null,"method":"initialize","params":null}`,
		`[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`,
		`{"jsonrpc":"2.0","id":{},"method":"x"}`,
		`{"jsonrpc":2,"id":1}`,
		`  {"jsonrpc":"2.0","id":-1.5e3,"method":"m","params":{"goal":1}}  `,
		`{`, `null`, `""`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, rerr := parseRequest(data)
		if rerr != nil {
			switch rerr.Code {
			case protocol.CodeParseError, protocol.CodeInvalidRequest, protocol.CodeInvalidParams:
			default:
				t.Fatalf("parseRequest(%q) error code %d, want a parse, request or params error", data, rerr.Code)
			}
			if req != nil && req.id != nil && !json.Valid(req.id) {
				t.Fatalf("parseRequest(%q) error carries invalid id %q", data, req.id)
			}
			return
		}
		if req.method == "" {
			t.Fatalf("parseRequest(%q) = empty method, no error", data)
		}
		if req.id != nil && !json.Valid(req.id) {
			t.Fatalf("parseRequest(%q) id %q is not JSON", data, req.id)
		}
		if req.params != nil && req.params[0] != '{' {
			t.Fatalf("parseRequest(%q) params %q is not an object", data, req.params)
		}
		var p protocol.RunStartParams
		if err := decodeParams(req.params, &p); err != nil {
			if pe, ok := err.(*protocol.Error); !ok || pe.Code != protocol.CodeInvalidParams {
				t.Fatalf("decodeParams(%q) = %v, want a CodeInvalidParams error", req.params, err)
			}
		}
	})
}
