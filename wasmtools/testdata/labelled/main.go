// Command labelled is a test fixture for package wasmtools: a keel tool
// whose manifest declares that its output carries the label pii. It is
// built for wasip1, as a reactor, by TestToolkitManifestLabels: the host
// reads its manifest from its keel_manifest export.
package main

import (
	"encoding/json"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

var manifest = toolkit.Manifest{
	Name:        "labelled",
	Description: "Returns a person's record.",
	InputSchema: json.RawMessage(`{"type": "object"}`),
	SideEffects: toolkit.ReadOnly,
	Labels:      []string{"pii"},
}

func handler(json.RawMessage) (any, error) { return map[string]string{"name": "Ada"}, nil }

func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }
