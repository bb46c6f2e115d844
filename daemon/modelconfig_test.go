package daemon_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/openai/openaitest"
	"github.com/keel-runtime/keel/models/scripted"
)

func writeModelsConfig(t *testing.T, dir string, cfg any) {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, daemon.ModelsConfigFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeCloudRoute writes a models.json that allows the cloud and routes
// "default" to srv's chat model (16384 tokens of context, with tools)
// alone, with no retries.
func writeCloudRoute(t *testing.T, dir string, srv *openaitest.Server) {
	t.Helper()
	writeModelsConfig(t, dir, map[string]any{
		"allow_cloud": true,
		"providers": map[string]any{"cloud": map[string]any{
			"base_url": srv.URL(), "max_retries": -1,
			"models": []any{map[string]any{"name": openaitest.ChatModel, "context_length": 16384,
				"capabilities": []string{"completion", "tools"}}},
		}},
		"routes": []any{map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "cloud", "model": openaitest.ChatModel}}}},
	})
}

// TestCloudPolicyEndToEnd configures a cloud provider (an
// OpenAI-compatible server on loopback) in models.json and runs through
// the daemon: private runs and runs that do not allow cloud never reach
// it (the server proves it received nothing); an allowed run does, with
// the key, and its span carries the provider and the cost. The key is
// never written to the database.
func TestCloudPolicyEndToEnd(t *testing.T) {
	t.Parallel()
	const key = cloudKey
	srv := openaitest.New(t)
	srv.SetKey(key)
	dir := noTools(t)
	writeModelsConfig(t, dir, map[string]any{
		"allow_cloud": true,
		"providers": map[string]any{"cloud": map[string]any{
			"base_url": srv.URL(), "api_key_env": cloudKeyEnv, "max_retries": -1,
			"models": []any{map[string]any{"name": openaitest.ChatModel, "context_length": 16384,
				"capabilities": []string{"completion", "tools"}, "price": map[string]any{"input_per_mtok": 1, "output_per_mtok": 2}}},
		}},
		"routes": []any{map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "cloud", "model": openaitest.ChatModel}}}},
	})
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	ctx := context.Background()
	chats := func() int {
		n := 0
		for _, r := range srv.Requests() {
			if r.Path == openaitest.ChatPath {
				n++
			}
		}
		return n
	}

	for _, tt := range []struct {
		name   string
		policy keel.RunPolicy
		want   string
	}{
		{"private", keel.RunPolicy{AllowCloud: true, Private: true}, "private"},
		{"cloud not allowed", keel.RunPolicy{}, "does not allow cloud"},
	} {
		run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "say hi", Model: "default", Policy: tt.policy})
		if err != nil {
			t.Fatalf("%s: StartRun: %v", tt.name, err)
		}
		follow(t, c, run.ID)
		got, err := c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Run.Status != keel.RunFailed || !strings.Contains(got.Run.Error, "policy_denied") || !strings.Contains(got.Run.Error, tt.want) {
			t.Errorf("%s run: %s %q, want failed by policy mentioning %q", tt.name, got.Run.Status, got.Run.Error, tt.want)
		}
	}
	if n := chats(); n != 0 {
		t.Fatalf("the cloud server received %d chat requests from runs that may not use it", n)
	}

	got := runToEnd(t, c, protocol.RunStartParams{Goal: "say hi", Model: "default", MaxSteps: 3, Policy: keel.RunPolicy{AllowCloud: true}})
	if chats() == 0 {
		t.Fatalf("allowed run %s (%s %q) sent nothing to the cloud", got.Run.ID, got.Run.Status, got.Run.Error)
	}
	for _, r := range srv.Requests() {
		if r.Header.Get("Authorization") != "Bearer "+key {
			t.Errorf("request %s %s carried Authorization %q", r.Method, r.Path, r.Header.Get("Authorization"))
		}
	}
	first := slices.IndexFunc(got.Spans, func(sp keel.Span) bool { return sp.Kind == keel.SpanModelCall })
	if first < 0 || got.Spans[first].Provider != "cloud" || got.Spans[first].CostUSD <= 0 {
		t.Errorf("first model span of %+v, want provider cloud with a cost", got.Spans)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "keel.db*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), key) {
			t.Errorf("%s contains the API key", filepath.Base(f))
		}
	}
}

// TestBadModelsConfigRefusesToStart: a typo in models.json stops the
// daemon with the file named, rather than being ignored.
func TestBadModelsConfigRefusesToStart(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]any{
		"unknown field":  map[string]any{"allow_clouds": true},
		"unknown target": map[string]any{"routes": []any{map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "nope", "model": "m"}}}}},
		"bad duration":   map[string]any{"ollama": map[string]any{"timeout": "soon"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := noTools(t)
			writeModelsConfig(t, dir, cfg)
			err := daemon.Run(t.Context(), daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err == nil || !strings.Contains(err.Error(), daemon.ModelsConfigFile) {
				t.Errorf("daemon.Run with a bad models.json = %v, want an error naming the file", err)
			}
		})
	}
}

// TestModelsConfigTrailingData: a models.json with a second object after
// the first (a paste gone wrong) is refused naming the file; it used to
// be read up to the first object, the rest silently ignored.
func TestModelsConfigTrailingData(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	if err := os.WriteFile(filepath.Join(dir, daemon.ModelsConfigFile), []byte(`{"allow_cloud": false} {"allow_cloud": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := daemon.Run(ctx, daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), daemon.ModelsConfigFile) || !strings.Contains(err.Error(), "after its JSON object") {
		t.Errorf("daemon.Run with trailing data in models.json = %v, want an error naming the file and the trailing data", err)
	}
}
