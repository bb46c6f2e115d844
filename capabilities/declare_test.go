package capabilities

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
)

func TestDeclareProviders(t *testing.T) {
	list := keel.ModelList{
		Providers: []keel.ProviderStatus{
			{Name: "ollama", Endpoint: "http://127.0.0.1:11434", Reachable: true},
			{Name: "lab", Reachable: false, Error: "refused", Hint: "start it"},
			{Name: "cloudy", Reachable: true},
		},
		Models: []keel.ModelInfo{
			{Name: "tiny", Provider: "ollama", Capabilities: []string{"completion"}, ContextLength: 2048, Size: 1},
			{Name: "big", Provider: "cloudy", Capabilities: []string{"tools"}, ContextLength: 128000},
		},
	}
	kinds := map[string]ProviderKind{"ollama": {Name: "scripted"}, "cloudy": {Cloud: true}}
	want := []ProviderDecl{
		{Name: "scripted", Kind: "local", Endpoint: "http://127.0.0.1:11434", Reachable: true,
			Models: []ModelDecl{{Name: "tiny", Capabilities: []string{"completion"}, ContextLength: 2048}}},
		{Name: "lab", Kind: "local", Error: "refused", Hint: "start it"},
		{Name: "cloudy", Kind: "cloud", Reachable: true, Models: []ModelDecl{{Name: "big", Capabilities: []string{"tools"}, ContextLength: 128000}}},
	}
	if diff := cmp.Diff(want, DeclareProviders(list, kinds)); diff != "" {
		t.Errorf("DeclareProviders (-want +got):\n%s", diff)
	}
}
