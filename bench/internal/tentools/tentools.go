// Package tentools seeds a keel data dir with ten installed tools for the
// benchmarks: the 4 bundled examples plus 6 distinct variants of
// wordcount (a custom section makes each binary, and so its cache entry
// and compiled code, different; a sidecar manifest names it).
package tentools

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// Seed writes the ten tools into dir/tools and marks the examples as
// installed, so the daemon leaves the directory as it is.
func Seed(dir string) error {
	tools := filepath.Join(dir, "tools")
	if err := builtin.Install(tools); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		return err
	}
	wc, err := os.ReadFile(filepath.Join(tools, "wordcount.wasm"))
	if err != nil {
		return err
	}
	for i := 1; i <= 6; i++ {
		name := fmt.Sprintf("wordcount%d", i)
		bin := append(append([]byte{}, wc...), customSection(name)...)
		if err := os.WriteFile(filepath.Join(tools, name+".wasm"), bin, 0o644); err != nil {
			return err
		}
		m, _ := json.Marshal(map[string]any{
			"name": name, "version": "0.1.0", "description": "wordcount variant " + name,
			"input_schema": json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
			"side_effects": "read_only",
		})
		if err := os.WriteFile(filepath.Join(tools, name+".manifest.json"), m, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// customSection returns a wasm custom section named "keel.bench" holding payload.
func customSection(payload string) []byte {
	name := "keel.bench"
	body := append(uleb(len(name)), name...)
	body = append(body, payload...)
	return append(append([]byte{0}, uleb(len(body))...), body...)
}

func uleb(n int) []byte {
	var out []byte
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			out = append(out, b|0x80)
			continue
		}
		return append(out, b)
	}
}
