package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/openai/openaitest"
)

// fakeOllama is an httptest server speaking the parts of Ollama's API
// that models.list and models.pull use: /api/tags and /api/show describe
// one model, keel-fake, and /api/pull pulls qwen2.5:0.5b (one layer, in
// three reports), hangs on keel-hang until the request ends, and fails
// for any other model as Ollama does for a name its registry lacks.
type fakeOllama struct {
	srv *httptest.Server
	// hung and ended receive one value for every keel-hang pull: when it
	// has sent its progress, and when Ollama sees its request end.
	hung, ended chan struct{}

	mu    sync.Mutex
	pulls []string // models /api/pull was asked for
}

func startFakeOllama(t *testing.T) *fakeOllama {
	t.Helper()
	f := &fakeOllama{hung: make(chan struct{}, 1), ended: make(chan struct{}, 1)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/tags":
			io.WriteString(w, `{"models":[{"name":"keel-fake:latest","model":"keel-fake:latest","size":1234567}]}`)
		case "/api/show":
			io.WriteString(w, `{"capabilities":["completion","tools"],"model_info":{"general.architecture":"llama","llama.context_length":4096},"details":{"family":"llama"}}`)
		case "/api/pull":
			var req struct{ Model string }
			json.NewDecoder(r.Body).Decode(&req)
			f.mu.Lock()
			f.pulls = append(f.pulls, req.Model)
			f.mu.Unlock()
			w.Header().Set("Content-Type", "application/x-ndjson")
			f.pull(w, r, req.Model)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOllama) pull(w http.ResponseWriter, r *http.Request, model string) {
	switch model {
	case "qwen2.5:0.5b":
		streamLines(w,
			`{"status":"pulling manifest"}`,
			`{"status":"pulling 8eeb52dfb3bb","digest":"sha256:8eeb52dfb3bb","total":2000000}`,
			`{"status":"pulling 8eeb52dfb3bb","digest":"sha256:8eeb52dfb3bb","total":2000000,"completed":500000}`,
			`{"status":"pulling 8eeb52dfb3bb","digest":"sha256:8eeb52dfb3bb","total":2000000,"completed":2000000}`,
			`{"status":"verifying sha256 digest"}`,
			`{"status":"writing manifest"}`,
			`{"status":"success"}`)
	case "keel-hang":
		streamLines(w, `{"status":"pulling manifest"}`, `{"status":"pulling 8eeb52dfb3bb","digest":"sha256:8eeb52dfb3bb","total":2000000,"completed":1}`)
		f.hung <- struct{}{}
		<-r.Context().Done()
		f.ended <- struct{}{}
	default:
		streamLines(w, `{"status":"pulling manifest"}`, `{"error":"pull model manifest: file does not exist"}`)
	}
}

func (f *fakeOllama) pulled() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pulls)
}

// waitFor waits for a value on ch, failing the test after 30s.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30s", what)
	}
}

// streamLines writes each line of NDJSON and flushes it.
func streamLines(w http.ResponseWriter, lines ...string) {
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

// TestModelsPull pulls through the daemon from a fake Ollama: progress
// reaches the client in order and the CLI shows it; a name the registry
// does not know and a malformed one are invalid params; models.list shows
// the models. Then pulls that Ollama never finishes are ended three ways
// (the client disconnects, the CLI gets Ctrl-C, the daemon shuts down),
// and each time Ollama sees the pull request end.
func TestModelsPull(t *testing.T) {
	t.Parallel()
	ollama := startFakeOllama(t)
	d := startDaemon(t, daemon.Config{OllamaHost: ollama.srv.URL})
	c := dial(t, d.dir)
	ctx := context.Background()

	t.Run("progress", func(t *testing.T) {
		var got []protocol.ModelsPullProgress
		res, err := c.PullModel(ctx, "qwen2.5:0.5b", func(p protocol.ModelsPullProgress) {
			p.ID = nil
			got = append(got, p)
		})
		if err != nil || res.Name != "qwen2.5:0.5b" {
			t.Fatalf("PullModel = %+v, %v", res, err)
		}
		layer := func(done int64) protocol.ModelsPullProgress {
			return protocol.ModelsPullProgress{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 2000000, Completed: done}
		}
		want := []protocol.ModelsPullProgress{{Status: "pulling manifest"}, layer(0), layer(500000), layer(2000000),
			{Status: "verifying sha256 digest"}, {Status: "writing manifest"}, {Status: "success"}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("progress (-want +got):\n%s", diff)
		}
		out, errs, code := runCLI(ctx, d.dir, "models", "pull", "qwen2.5:0.5b")
		wantOut := "pulling manifest\npulling 8eeb52dfb3bb (2.0 MB)\nverifying sha256 digest\nwriting manifest\nsuccess\npulled qwen2.5:0.5b\n"
		if code != cli.ExitOK || out != wantOut {
			t.Errorf("keel models pull: code %d, stdout %q, want %q; stderr %s", code, out, wantOut, errs)
		}
	})

	t.Run("bad names", func(t *testing.T) {
		before := len(ollama.pulled())
		_, err := c.PullModel(ctx, "keel-nope", nil)
		if pe := wantCode(t, err, protocol.CodeInvalidParams, "pull of a model the registry lacks"); !strings.Contains(pe.Message, "no model of that name") {
			t.Errorf("pull of a model the registry lacks: %q does not say so", pe.Message)
		}
		_, errs, code := runCLI(ctx, d.dir, "models", "pull", "keel-nope")
		if code != cli.ExitFailure || !strings.Contains(errs, "no model of that name") {
			t.Errorf("keel models pull keel-nope: code %d, stderr %s", code, errs)
		}
		_, err = c.PullModel(ctx, "Bad Name!!", nil)
		if pe := wantCode(t, err, protocol.CodeInvalidParams, "pull of a malformed name"); !strings.Contains(pe.Message, "not a valid model name") {
			t.Errorf("pull of a malformed name: %q does not say so", pe.Message)
		}
		if got := ollama.pulled()[before:]; !slices.Equal(got, []string{"keel-nope", "keel-nope"}) {
			t.Errorf("Ollama was asked to pull %q, want keel-nope twice and never the malformed name", got)
		}
	})

	t.Run("list", func(t *testing.T) {
		list, err := c.ListModels(ctx)
		want := protocol.ModelsListResult{
			Models: []protocol.ModelInfo{{Name: "keel-fake", Provider: "ollama", Capabilities: []string{"completion", "tools", "structured"},
				ContextLength: 4096, Size: 1234567, Family: "llama"}},
			Providers: []protocol.ProviderStatus{{Name: "ollama", Endpoint: ollama.srv.URL, Reachable: true}},
		}
		if diff := cmp.Diff(want, list); err != nil || diff != "" {
			t.Errorf("ListModels = %v (-want +got):\n%s", err, diff)
		}
		out, _, code := runCLI(ctx, d.dir, "models", "list")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != cli.ExitOK || len(lines) != 2 || !slices.Equal(strings.Fields(lines[0]), []string{"NAME", "PROVIDER", "CAPABILITIES", "CONTEXT", "SIZE"}) ||
			!slices.Equal(strings.Fields(lines[1]), []string{"keel-fake", "ollama", "completion,tools,structured", "4096", "1.2", "MB"}) {
			t.Errorf("keel models list: code %d\n%s", code, out)
		}
		out, _, code = runCLI(ctx, d.dir, "models", "list", "--json")
		var fromJSON protocol.ModelsListResult
		if err := json.Unmarshal([]byte(out), &fromJSON); code != cli.ExitOK || err != nil || !cmp.Equal(fromJSON, want) {
			t.Errorf("keel models list --json: code %d, %v\n%s", code, err, out)
		}
	})

	// pullHang starts a pull Ollama never finishes on a client of its
	// own and returns how it ended, once it has.
	pullHang := func(t *testing.T, cl *client.Client) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := cl.PullModel(ctx, "keel-hang", nil)
			done <- err
		}()
		waitFor(t, ollama.hung, "the pull reaching Ollama")
		return done
	}
	wantClosed := func(t *testing.T, done <-chan error) {
		t.Helper()
		select {
		case err := <-done:
			if !errors.Is(err, client.ErrClosed) {
				t.Errorf("PullModel = %v, want an error wrapping client.ErrClosed", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("PullModel did not return")
		}
	}

	t.Run("client disconnects", func(t *testing.T) {
		puller := dial(t, d.dir)
		done := pullHang(t, puller)
		dial(t, d.dir).Close() // another client's disconnect ends nothing
		select {
		case <-ollama.ended:
			t.Fatal("the pull ended when another client disconnected")
		case <-time.After(200 * time.Millisecond):
		}
		puller.Close()
		waitFor(t, ollama.ended, "Ollama seeing the pull end after its client disconnected")
		wantClosed(t, done)
	})

	t.Run("Ctrl-C", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			errs string
			code int
		}
		done := make(chan result, 1)
		go func() {
			_, errs, code := runCLI(ctx, d.dir, "models", "pull", "keel-hang")
			done <- result{errs, code}
		}()
		waitFor(t, ollama.hung, "the pull reaching Ollama")
		cancel()
		waitFor(t, ollama.ended, "Ollama seeing the pull end after Ctrl-C")
		// Ctrl-C may come before the progress reached the CLI: its
		// output is not checked.
		if r := <-done; r.code != cli.ExitCancelled || !strings.Contains(r.errs, "pull of keel-hang cancelled") {
			t.Errorf("keel models pull after Ctrl-C: code %d, want %d; stderr %q", r.code, cli.ExitCancelled, r.errs)
		}
	})

	t.Run("daemon shuts down", func(t *testing.T) {
		done := pullHang(t, c)
		if err := d.stop(); err != nil {
			t.Errorf("daemon stop during a pull: %v", err)
		}
		waitFor(t, ollama.ended, "Ollama seeing the pull end at shutdown")
		wantClosed(t, done)
	})
}

// TestModelsProvidersDown lists and pulls while Ollama is down and one of
// the two providers of models.json does not answer: models.list reports
// each provider with what to do, pulls say to start Ollama, and the
// daemon serves on.
func TestModelsProvidersDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String() // nothing listens there
	ln.Close()
	gone := "http://" + closed + "/v1"
	srv := openaitest.New(t)
	dir := noTools(t)
	writeModelsConfig(t, dir, map[string]any{"providers": map[string]any{
		"lab": map[string]any{"base_url": srv.URL(), "local": true,
			"models": []any{map[string]any{"name": openaitest.ChatModel, "context_length": 16384, "capabilities": []string{"completion", "tools"}}}},
		"gone": map[string]any{"base_url": gone, "local": true, "discover": true},
	}})
	d := startDaemon(t, daemon.Config{DataDir: dir, OllamaHost: closed})
	c := dial(t, d.dir)
	ctx := context.Background()

	list, err := c.ListModels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Providers {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"gone", "lab", "ollama"}) {
		t.Fatalf("providers = %+v, want gone, lab, ollama", list.Providers)
	}
	if p := list.Providers[0]; p.Reachable || p.Endpoint != gone || p.Error == "" || !strings.Contains(p.Hint, daemon.ModelsConfigFile) {
		t.Errorf("provider gone = %+v, want unreachable at %s, with an error and a hint naming %s", p, gone, daemon.ModelsConfigFile)
	}
	if p := list.Providers[1]; !p.Reachable || p.Endpoint != srv.URL() {
		t.Errorf("provider lab = %+v, want reachable at %s", p, srv.URL())
	}
	if p := list.Providers[2]; p.Reachable || !strings.Contains(p.Error, closed) || !strings.Contains(p.Hint, "ollama serve") {
		t.Errorf("provider ollama = %+v, want unreachable, naming %s, with a hint to start Ollama", p, closed)
	}
	want := []protocol.ModelInfo{{Name: openaitest.ChatModel, Provider: "lab", Capabilities: []string{"completion", "tools"}, ContextLength: 16384}}
	if diff := cmp.Diff(want, list.Models); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}
	out, errs, code := runCLI(ctx, d.dir, "models", "list")
	if code != cli.ExitFailure || !strings.Contains(out, openaitest.ChatModel) ||
		!strings.Contains(errs, "provider ollama") || !strings.Contains(errs, "do: start Ollama") || !strings.Contains(errs, "provider gone") {
		t.Errorf("keel models list with providers down: code %d\nstdout %s\nstderr %s", code, out, errs)
	}

	_, err = c.PullModel(ctx, "qwen2.5:0.5b", nil)
	if pe := wantCode(t, err, protocol.CodeModelUnavailable, "pull with Ollama down"); !strings.Contains(pe.Message, "ollama serve") || !strings.Contains(pe.Message, "OLLAMA_HOST") {
		t.Errorf("pull with Ollama down: %q does not say to start Ollama or set OLLAMA_HOST", pe.Message)
	}
	_, errs, code = runCLI(ctx, d.dir, "models", "pull", "qwen2.5:0.5b")
	if code != cli.ExitFailure || !strings.Contains(errs, "OLLAMA_HOST") {
		t.Errorf("keel models pull with Ollama down: code %d, stderr %s", code, errs)
	}
	if _, err := c.Describe(ctx); err != nil {
		t.Errorf("daemon unhealthy after Ollama-down errors: %v", err)
	}
}

// TestModelsRealOllama lists the tiny models of the real Ollama with
// their capabilities and context length, and pulls a model no registry
// has: the error says what went wrong and the daemon serves on.
func TestModelsRealOllama(t *testing.T) {
	t.Parallel()
	realOllama(t)
	tiny, tools := envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny"), envOr("KEEL_TEST_OLLAMA_TOOLS_MODEL", "keel-tiny-tools")
	d := startDaemon(t, daemon.Config{})
	c := dial(t, d.dir)
	ctx := context.Background()
	list, err := c.ListModels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Providers) != 1 || !list.Providers[0].Reachable || list.Providers[0].Name != "ollama" {
		t.Errorf("providers = %+v, want ollama, reachable", list.Providers)
	}
	for name, caps := range map[string][]string{tiny: {"completion", "structured"}, tools: {"completion", "tools", "structured"}} {
		i := slices.IndexFunc(list.Models, func(m protocol.ModelInfo) bool { return m.Name == name })
		if i < 0 {
			t.Errorf("models.list = %+v, want %s listed", list.Models, name)
			continue
		}
		if m := list.Models[i]; !slices.Equal(m.Capabilities, caps) || m.ContextLength != 2048 || m.Provider != "ollama" || m.Size <= 0 || m.Family != "llama" {
			t.Errorf("models.list has %+v, want capabilities %v, context length 2048, provider ollama, family llama, a size", m, caps)
		}
	}
	out, _, code := runCLI(ctx, d.dir, "models", "list")
	if code != cli.ExitOK || !strings.Contains(out, tools) || !strings.Contains(out, "completion,tools,structured") || !strings.Contains(out, "2048") {
		t.Errorf("keel models list: code %d\n%s", code, out)
	}

	// Without internet access Ollama cannot reach its registry; with it,
	// the registry has no such model. Either way the message says which.
	_, err = c.PullModel(ctx, "keel-no-such-model-7f3a", nil)
	var pe *protocol.Error
	switch {
	case !errors.As(err, &pe):
		t.Fatalf("pull of a model no registry has = %v, want a protocol error", err)
	case pe.Code == protocol.CodeModelUnavailable:
		if !strings.Contains(pe.Message, "could not get the model from its registry") {
			t.Errorf("pull without a registry: %q does not say Ollama cannot reach its registry", pe.Message)
		}
	case pe.Code == protocol.CodeInvalidParams:
		if !strings.Contains(pe.Message, "no model of that name") {
			t.Errorf("pull of an unknown model: %q does not say the registry lacks it", pe.Message)
		}
	default:
		t.Errorf("pull of a model no registry has: code %d %q, want %d or %d", pe.Code, pe.Message, protocol.CodeModelUnavailable, protocol.CodeInvalidParams)
	}
	t.Logf("pull of a model no registry has: %v", err)
	_, errs, code := runCLI(ctx, d.dir, "models", "pull", "keel-no-such-model-7f3a")
	if code != cli.ExitFailure || !strings.Contains(errs, "registry") {
		t.Errorf("keel models pull keel-no-such-model-7f3a: code %d, stderr %s", code, errs)
	}
	if again, err := c.ListModels(ctx); err != nil || len(again.Models) != len(list.Models) {
		t.Errorf("models.list after the failed pulls = %d models, %v; want %d", len(again.Models), err, len(list.Models))
	}
}
