package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestUnknownModelAdvice: an unknown model of an OpenAI-compatible
// provider was answered with "pull it with `ollama pull …`", which cannot
// help; a bare name still gets the pull advice.
func TestUnknownModelAdvice(t *testing.T) {
	t.Parallel()
	list := []models.ModelInfo{
		{Name: "qwen", Provider: "ollama", Capabilities: []models.Capability{models.CapCompletion}},
		{Name: "gpt", Provider: "cloudy", Capabilities: []models.Capability{models.CapCompletion}},
	}
	e := &Engine{cfg: Config{Model: scripted.New(list)}}
	tests := []struct {
		name, want, notWant string
	}{
		{"cloudy/nope", "provider cloudy does not serve \"nope\"", "pull"},
		{"nope", "keel models pull nope", ""},
		{"ollama/nope", "keel models pull ollama/nope", ""},
		{"hf.co/org/m", "keel models pull hf.co/org/m", ""},
	}
	for _, tt := range tests {
		_, err := e.resolveModel(context.Background(), tt.name)
		if !errors.Is(err, keel.ErrModelUnavailable) {
			t.Fatalf("resolveModel(%q) = %v, want ErrModelUnavailable", tt.name, err)
		}
		if msg := err.Error(); !strings.Contains(msg, tt.want) || (tt.notWant != "" && strings.Contains(msg, tt.notWant)) {
			t.Errorf("resolveModel(%q) = %q, want it to say %q and not %q", tt.name, msg, tt.want, tt.notWant)
		}
	}
}
