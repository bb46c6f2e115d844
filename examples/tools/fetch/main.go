// Command fetch is an example keel tool that reaches the network: it GETs
// a URL and returns the start of the body as text. It requests any http or
// https destination, and keel grants it none until the user names some:
//
//	keel tools grant fetch net:https://example.com:443
//
// The host makes the request, and only to granted destinations; loopback
// and private addresses are refused whatever is granted.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o
// fetch.wasm; see ../README.md.
package main

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

const (
	defaultMaxBytes = 16 << 10
	maxMaxBytes     = 1 << 20
)

var manifest = toolkit.Manifest{
	Name:        "fetch",
	Version:     "0.1.0",
	Description: "Fetch a URL with GET and return its status, content type and the start of its body as text (max_bytes, default 16384). Only destinations the user granted can be reached.",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"url": {"type": "string", "format": "uri", "pattern": "^https?://", "description": "The URL to fetch."},
			"max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576, "description": "Return at most this many bytes of the body."}
		},
		"required": ["url"],
		"additionalProperties": false
	}`),
	OutputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"status": {"type": "integer"},
			"content_type": {"type": "string"},
			"body": {"type": "string"},
			"truncated": {"type": "boolean"}
		},
		"required": ["status", "content_type", "body", "truncated"],
		"additionalProperties": false
	}`),
	SideEffects: toolkit.ReadOnly,
	// Any destination, in principle: what it may reach is what the user grants.
	Requests: toolkit.Requests{Network: []string{"https://*:*", "http://*:*"}},
}

type input struct {
	URL      string `json:"url"`
	MaxBytes int    `json:"max_bytes"`
}

type output struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Body        string `json:"body"`
	Truncated   bool   `json:"truncated"`
}

var handler = toolkit.Typed(fetch)

// init registers the tool for a reactor build (-buildmode=c-shared, how
// keel ships it), which never runs main; main serves a command build.
func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }

func fetch(in input) (output, error) {
	resp, err := toolkit.Fetch(toolkit.Request{URL: in.URL, Headers: map[string]string{"User-Agent": "keel-fetch/0.1"}})
	if err != nil {
		return output{}, err
	}
	limit := in.MaxBytes
	if limit <= 0 {
		limit = defaultMaxBytes
	}
	limit = min(limit, maxMaxBytes)
	out := output{Status: resp.Status, ContentType: resp.Headers["Content-Type"]}
	if resp.BodyEncoding == "base64" {
		return out, toolkit.Errorf("not_text", "%s returned a body that is not text (%s)", in.URL, out.ContentType)
	}
	body := resp.Body
	if len(body) > limit {
		body, out.Truncated = body[:limit], true
		for !utf8.ValidString(body) && len(body) > 0 {
			body = body[:len(body)-1]
		}
	}
	out.Body = strings.ToValidUTF8(body, "")
	return out, nil
}
