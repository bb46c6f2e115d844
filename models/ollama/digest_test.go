package ollama

import (
	"net/http"
	"testing"
	"time"

	"github.com/keel-runtime/keel/models"
)

// TestChatReportsTheModelDigest: a reply carries the digest /api/tags
// lists for its model, read once per showTTL, read again after the TTL
// or a pull (so a changed model shows), and Models lists it too. A model
// /api/tags does not list has none, and the call still succeeds.
func TestChatReportsTheModelDigest(t *testing.T) {
	f := newFake(t)
	f.digests = map[string]string{"tiny": "aaa111"}
	f.lines = []any{chunk("hi"), done("stop", 3, 1)}
	p := f.provider(t, Config{})
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	chat := func(model string) string {
		t.Helper()
		resp, err := p.Chat(t.Context(), models.ChatRequest{Model: model, Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp.ModelDigest
	}
	if d := chat("tiny"); d != "aaa111" {
		t.Errorf("digest = %q, want aaa111", d)
	}
	f.mu.Lock()
	f.digests["tiny"] = "bbb222" // the model changed
	f.mu.Unlock()
	if d := chat("tiny:latest"); d != "aaa111" {
		t.Errorf("digest within the TTL = %q, want the cached aaa111", d)
	}
	if n := f.count("/api/tags"); n != 1 {
		t.Errorf("/api/tags called %d times within the TTL, want 1", n)
	}
	now = now.Add(showTTL)
	if d := chat("tiny"); d != "bbb222" {
		t.Errorf("digest after the TTL = %q, want bbb222", d)
	}
	f.mu.Lock()
	f.digests["tiny"] = "ccc333"
	f.mu.Unlock()
	if err := p.Pull(t.Context(), "tiny", nil); err != nil {
		t.Fatal(err)
	}
	if d := chat("tiny"); d != "ccc333" {
		t.Errorf("digest after a pull = %q, want ccc333", d)
	}
	list, err := p.Models(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if m.Name == "tiny" && m.Digest != "ccc333" {
			t.Errorf("Models lists tiny with digest %q, want ccc333", m.Digest)
		}
	}
	if d := chat("tools"); d != "" {
		t.Errorf("digest of a model listed without one = %q, want none", d)
	}
}

// TestChatDigestWhenTagsFail: a failed /api/tags costs the reply its
// digest, not the call, and is not asked again within showTTL.
func TestChatDigestWhenTagsFail(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.tagsStatus = http.StatusInternalServerError
	f.digests = map[string]string{"tiny": "aaa111"}
	f.lines = []any{chunk("hi"), done("stop", 3, 1)}
	p := f.provider(t, Config{})
	for range 2 {
		resp, err := p.Chat(t.Context(), hi("tiny"), nil)
		if err != nil {
			t.Fatalf("Chat() with /api/tags failing: error = %v", err)
		}
		if resp.ModelDigest != "" {
			t.Errorf("digest = %q, want none", resp.ModelDigest)
		}
	}
	if n := f.count("/api/tags"); n != 1 {
		t.Errorf("/api/tags called %d times within the TTL, want 1", n)
	}
}
