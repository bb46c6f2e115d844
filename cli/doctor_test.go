package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestDoctorDeclaresEverything: keel doctor and env.describe left out the
// providers of models.json, allow_cloud, the approval policy and the
// tool limits.
func TestDoctorDeclaresEverything(t *testing.T) {
	t.Parallel()
	modelsJSON := `{"allow_cloud": true, "providers": {"lab": {"base_url": "http://127.0.0.1:9/v1",
		"models": [{"name": "lab-large", "context_length": 8192, "capabilities": ["completion", "tools"]}]}}}`
	d := startDaemon(t, daemon.Config{
		RequireApproval:      []keel.SideEffect{keel.SideEffectExternal},
		ToolsWriteQuotaBytes: -1,
	}, scripted.New(nil), map[string]string{"models.json": modelsJSON})
	ctx := context.Background()

	env, err := d.c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lab *capabilities.ProviderDecl
	for i, p := range env.Providers {
		if p.Name == "lab" {
			lab = &env.Providers[i]
		}
	}
	if lab == nil || lab.Kind != "cloud" || lab.Endpoint != "http://127.0.0.1:9/v1" || len(lab.Models) != 1 || lab.Models[0].Name != "lab-large" {
		t.Errorf("env.describe providers = %+v, want the local one and lab (cloud) with lab-large", env.Providers)
	}
	if len(env.Providers) != 2 || env.Providers[0].Name != "scripted" || env.Providers[0].Kind != "local" {
		t.Errorf("env.describe providers = %+v, want the local provider first", env.Providers)
	}
	if !env.AllowCloud {
		t.Error("env.describe allow_cloud = false, want models.json's true")
	}
	if !cmp.Equal(env.RequireApproval, []string{"external"}) {
		t.Errorf("env.describe require_approval = %v, want [external]", env.RequireApproval)
	}
	wantLimits := capabilities.ToolLimits{CallTimeoutMS: 10_000, MemoryLimitMiB: 256, MaxOutputBytes: 1 << 20,
		WriteQuotaBytes: -1, MinFreeDiskBytes: 1 << 30, IdleUnloadMS: 300_000}
	if diff := cmp.Diff(wantLimits, env.ToolLimits); diff != "" {
		t.Errorf("env.describe tool_limits (-want +got):\n%s", diff)
	}

	out, _, _ := d.keel(ctx, "doctor")
	for _, want := range []string{"provider  lab (cloud) http://127.0.0.1:9/v1", "lab-large", "cloud models  on",
		"approval      external", "tool limits   10s per call, 256 MiB memory", "writes unlimited per grant"} {
		if !strings.Contains(out, want) {
			t.Errorf("keel doctor lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = d.keel(ctx, "doctor", "--json")
	var fromJSON map[string]any
	if err := json.Unmarshal([]byte(out), &fromJSON); err != nil {
		t.Fatalf("keel doctor --json: %v\n%s", err, out)
	}
	for _, key := range []string{"allow_cloud", "require_approval", "tool_limits", "providers"} {
		if _, ok := fromJSON[key]; !ok {
			t.Errorf("keel doctor --json lacks %q:\n%s", key, out)
		}
	}
}
