package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

func TestFetch(t *testing.T) {
	var sent toolkit.Request
	reply := `{"status":200,"headers":{"Content-Type":"text/plain"},"body":"héllo world"}`
	toolkit.FetchFunc = func(req []byte) ([]byte, error) {
		if err := json.Unmarshal(req, &sent); err != nil {
			t.Fatal(err)
		}
		return []byte(reply), nil
	}
	defer func() { toolkit.FetchFunc = nil }()

	got, err := fetch(input{URL: "https://example.com/x", MaxBytes: 2})
	if err != nil {
		t.Fatal(err)
	}
	// "hé" is 3 bytes; a 2-byte cut must not split the é.
	if got.Status != 200 || got.ContentType != "text/plain" || got.Body != "h" || !got.Truncated {
		t.Errorf("fetch = %+v", got)
	}
	if sent.URL != "https://example.com/x" || sent.Method != "" {
		t.Errorf("request sent = %+v", sent)
	}

	reply = `{"error":{"code":"permission_denied","message":"https://example.com:443 is not granted to fetch"}}`
	_, err = fetch(input{URL: "https://example.com/"})
	if te, ok := err.(*toolkit.Error); !ok || te.Code != "permission_denied" || !strings.Contains(te.Message, "not granted") {
		t.Errorf("fetch refused = %v, want the host's permission_denied", err)
	}
}
