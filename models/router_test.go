package models_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel/models"
)

// fake is a provider whose every call is decided by reply, with a record
// of what it received.
type fake struct {
	name   string
	models []models.ModelInfo
	reply  func(ctx context.Context, n int, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error)

	mu       sync.Mutex
	requests []models.ChatRequest
	inFlight atomic.Int32
	peak     atomic.Int32
}

func (f *fake) Name() string { return f.name }

func (f *fake) Models(context.Context) ([]models.ModelInfo, error) { return f.models, nil }

func (f *fake) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	f.mu.Lock()
	f.requests = append(f.requests, req)
	n := len(f.requests)
	f.mu.Unlock()
	cur := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		p := f.peak.Load()
		if cur <= p || f.peak.CompareAndSwap(p, cur) {
			break
		}
	}
	if f.reply == nil {
		return answer(onDelta, "ok"), nil
	}
	return f.reply(ctx, n, req, onDelta)
}

func (f *fake) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func answer(onDelta func(models.Delta), text string) models.ChatResponse {
	for _, w := range strings.SplitAfter(text, " ") {
		if onDelta != nil {
			onDelta(models.Delta{Content: w})
		}
	}
	return models.ChatResponse{Message: models.Message{Role: models.RoleAssistant, Content: text}, Usage: models.Usage{PromptTokens: 10, CompletionTokens: 5}, FinishReason: "stop"}
}

func newFake(name string, ms ...string) *fake {
	f := &fake{name: name}
	for _, m := range ms {
		f.models = append(f.models, models.ModelInfo{Name: m, Provider: name, ContextLength: 4096, Capabilities: []models.Capability{models.CapCompletion}})
	}
	return f
}

func router(t *testing.T, cfg models.RouterConfig) *models.Router {
	t.Helper()
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	}
	r, err := models.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hello() models.ChatRequest {
	return models.ChatRequest{Messages: []models.Message{{Role: models.RoleUser, Content: "hello"}}}
}

func withModel(req models.ChatRequest, model string) models.ChatRequest {
	req.Model = model
	return req
}

func TestRouterRetriesRateLimitThenSucceeds(t *testing.T) {
	local := newFake("local", "m")
	local.reply = func(ctx context.Context, n int, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		if n == 1 {
			return models.ChatResponse{}, &models.Error{Kind: models.KindRateLimited, Status: 429, RetryAfter: 30 * time.Millisecond, Msg: "slow down"}
		}
		return answer(onDelta, "fine"), nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	start := time.Now()
	resp, err := r.Chat(t.Context(), withModel(hello(), "local/m"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Errorf("retried after %v, want at least the Retry-After of 30ms", waited)
	}
	if resp.Meta.Retries != 1 || len(resp.Meta.Attempts) != 1 || resp.Meta.Attempts[0].Kind != models.KindRateLimited {
		t.Errorf("Meta = %+v, want one rate-limited attempt and one retry", resp.Meta)
	}
	if resp.Meta.Provider != "local" || resp.Message.Content != "fine" {
		t.Errorf("reply = %+v", resp)
	}
}

func TestRouterDoesNotRetryInvalidRequest(t *testing.T) {
	local := newFake("local", "m", "other")
	local.reply = func(context.Context, int, models.ChatRequest, func(models.Delta)) (models.ChatResponse, error) {
		return models.ChatResponse{}, &models.Error{Kind: models.KindInvalidRequest, Msg: "bad"}
	}
	r := router(t, models.RouterConfig{
		Providers: map[string]models.ProviderConfig{"local": {Provider: local}},
		Routes:    []models.Route{{Name: "default", Targets: []models.Target{{Provider: "local", Model: "m"}}, Fallback: []models.Target{{Provider: "local", Model: "other"}}}},
	})
	_, err := r.Chat(t.Context(), hello(), nil)
	if !errors.Is(err, models.ErrInvalidRequest) || local.calls() != 1 {
		t.Errorf("Chat() = %v after %d calls, want ErrInvalidRequest after exactly 1 (no retry, no fallback)", err, local.calls())
	}
}

func TestRouterFallsBackAfterRetries(t *testing.T) {
	primary := newFake("primary", "big")
	primary.reply = func(context.Context, int, models.ChatRequest, func(models.Delta)) (models.ChatResponse, error) {
		return models.ChatResponse{}, &models.Error{Kind: models.KindNetwork, Msg: "connection refused"}
	}
	backup := newFake("backup", "small")
	r := router(t, models.RouterConfig{
		Providers: map[string]models.ProviderConfig{"primary": {Provider: primary, MaxRetries: 2}, "backup": {Provider: backup}},
		Routes:    []models.Route{{Name: "default", Targets: []models.Target{{Provider: "primary", Model: "big"}}, Fallback: []models.Target{{Provider: "backup", Model: "small"}}}},
	})
	resp, err := r.Chat(t.Context(), hello(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if primary.calls() != 3 || backup.calls() != 1 {
		t.Errorf("calls: primary %d, backup %d; want 3 (1 + 2 retries) and 1", primary.calls(), backup.calls())
	}
	if resp.Meta.Provider != "backup" || len(resp.Meta.Attempts) != 3 || resp.Meta.Route != "default" {
		t.Errorf("Meta = %+v, want served by backup after 3 failed attempts on route default", resp.Meta)
	}
}

func TestRouterPolicyKeepsPrivateContentLocal(t *testing.T) {
	cloud := newFake("cloud", "gpt")
	cfg := models.RouterConfig{
		Providers:  map[string]models.ProviderConfig{"cloud": {Provider: cloud, Cloud: true}},
		Routes:     []models.Route{{Name: "default", Targets: []models.Target{{Provider: "cloud", Model: "gpt"}}}},
		AllowCloud: true,
	}
	private := hello()
	private.AllowCloud = true
	private.Messages = append(private.Messages, models.Message{Role: models.RoleTool, Content: "secret file", Private: true})
	privateLabel := hello()
	privateLabel.AllowCloud = true
	privateLabel.Messages = append(privateLabel.Messages, models.Message{Role: models.RoleTool, Content: "notes", Labels: []string{"pii", "private"}})
	privateRequest := hello()
	privateRequest.AllowCloud, privateRequest.Labels = true, []string{"private"}
	notAllowed := hello()
	offCfg := cfg
	offCfg.AllowCloud = false
	allowed := hello()
	allowed.AllowCloud = true
	tests := []struct {
		name string
		cfg  models.RouterConfig
		req  models.ChatRequest
		want string
	}{
		{"private message", cfg, private, "private"},
		{"message labelled private", cfg, privateLabel, "private"},
		{"request labelled private", cfg, privateRequest, "private"},
		{"run does not allow cloud", cfg, notAllowed, "does not allow cloud"},
		{"cloud switched off", offCfg, allowed, "switched off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := router(t, tt.cfg)
			_, err := r.Chat(t.Context(), tt.req, nil)
			if !errors.Is(err, models.ErrPolicy) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Chat() = %v, want ErrPolicy mentioning %q", err, tt.want)
			}
		})
	}
	if n := cloud.calls(); n != 0 {
		t.Fatalf("the cloud provider received %d requests, want none", n)
	}
	if _, err := router(t, cfg).Chat(t.Context(), allowed, nil); err != nil || cloud.calls() != 1 {
		t.Errorf("allowed cloud call: %v, %d calls; want success", err, cloud.calls())
	}
}

func TestRouterPolicyFallsBackToLocal(t *testing.T) {
	cloud, local := newFake("cloud", "gpt"), newFake("local", "tiny")
	r := router(t, models.RouterConfig{
		Providers:  map[string]models.ProviderConfig{"cloud": {Provider: cloud, Cloud: true}, "local": {Provider: local}},
		Routes:     []models.Route{{Name: "default", Targets: []models.Target{{Provider: "cloud", Model: "gpt"}}, Fallback: []models.Target{{Provider: "local", Model: "tiny"}}}},
		AllowCloud: true,
	})
	req := hello()
	req.AllowCloud, req.Private = true, true
	resp, err := r.Chat(t.Context(), req, nil)
	if err != nil || resp.Meta.Provider != "local" || cloud.calls() != 0 {
		t.Errorf("Chat() = %+v, %v with %d cloud calls; want the local fallback and no cloud call", resp.Meta, err, cloud.calls())
	}
}

// TestRouterAdmitIsAskedPerTarget: ChatRequest.Admit is asked before
// each target with its provider, model and whether it is a cloud one; a
// refusal sends nothing to that target, is a policy error carrying the
// refusal, and falls back to the next target.
func TestRouterAdmitIsAskedPerTarget(t *testing.T) {
	cloud, local := newFake("cloud", "gpt"), newFake("local", "tiny")
	r := router(t, models.RouterConfig{
		Providers:  map[string]models.ProviderConfig{"cloud": {Provider: cloud, Cloud: true}, "local": {Provider: local}},
		Routes:     []models.Route{{Name: "default", Targets: []models.Target{{Provider: "cloud", Model: "gpt"}}, Fallback: []models.Target{{Provider: "local", Model: "tiny"}}}},
		AllowCloud: true,
	})
	refused := errors.New("no cloud by policy")
	var asked []string
	req := hello()
	req.AllowCloud = true
	req.Admit = func(provider, model string, isCloud bool) error {
		asked = append(asked, fmt.Sprintf("%s/%s cloud=%v", provider, model, isCloud))
		if isCloud {
			return refused
		}
		return nil
	}
	resp, err := r.Chat(t.Context(), req, nil)
	if err != nil || resp.Meta.Provider != "local" || cloud.calls() != 0 {
		t.Fatalf("Chat() = %+v, %v with %d cloud calls; want the local fallback and no cloud call", resp.Meta, err, cloud.calls())
	}
	if want := []string{"cloud/gpt cloud=true", "local/tiny cloud=false"}; !slices.Equal(asked, want) {
		t.Errorf("Admit asked about %q, want %q", asked, want)
	}
	if a := resp.Meta.Attempts; len(a) != 1 || a[0].Kind != models.KindPolicy || !strings.Contains(a[0].Error, refused.Error()) {
		t.Errorf("attempts = %+v, want one policy refusal naming the reason", a)
	}
	req.Admit = func(string, string, bool) error { return refused }
	if _, err := r.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrPolicy) || !errors.Is(err, refused) || local.calls() != 1 {
		t.Errorf("Chat() with every target refused = %v after %d local calls, want ErrPolicy wrapping the refusal and no call", err, local.calls())
	}
}

func TestRouterBudgetRefusesBeforeSending(t *testing.T) {
	local := newFake("local", "m")
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	req := withModel(hello(), "local/m")
	req.Budget = models.NewBudget("run", models.Limits{Tokens: 10}, 0, 0)
	_, err := r.Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrBudgetExceeded) || local.calls() != 0 {
		t.Errorf("Chat() = %v after %d calls, want ErrBudgetExceeded before any call", err, local.calls())
	}
}

func TestRouterBudgetStopsStreamMidway(t *testing.T) {
	local := newFake("local", "m")
	var sentAfterStop atomic.Int32
	local.reply = func(ctx context.Context, _ int, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		// A provider that ignores the completion cap.
		for i := 0; i < 10000; i++ {
			if ctx.Err() != nil {
				return models.ChatResponse{}, ctx.Err()
			}
			onDelta(models.Delta{Content: "tok "})
			if i > req.MaxTokens+100 {
				sentAfterStop.Add(1)
			}
		}
		return answer(nil, "done"), nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local, MaxRetries: -1}}})
	req := withModel(hello(), "local/m")
	budget := models.NewBudget("run", models.Limits{Tokens: 200}, 0, 0)
	req.Budget = budget
	deltas := 0
	_, err := r.Chat(t.Context(), req, func(models.Delta) { deltas++ })
	if !errors.Is(err, models.ErrBudgetExceeded) {
		t.Fatalf("Chat() = %v, want ErrBudgetExceeded when the stream outgrows its reservation", err)
	}
	if sentAfterStop.Load() > 0 || deltas > 200 {
		t.Errorf("stream went on: %d deltas delivered, %d past the cap", deltas, sentAfterStop.Load())
	}
	if tok, _ := budget.Spent(); tok == 0 || tok > 260 {
		t.Errorf("budget spent %d tokens, want what streamed (about 200)", tok)
	}
	if left, _ := budget.Left(); left < 0 {
		t.Errorf("budget left %d", left)
	}
}

func TestRouterFirstTokenTimeoutRetries(t *testing.T) {
	local := newFake("local", "m")
	local.reply = func(ctx context.Context, n int, _ models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		if n == 1 {
			<-ctx.Done()
			return models.ChatResponse{}, ctx.Err()
		}
		return answer(onDelta, "late but fine"), nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local, FirstTokenTimeout: 20 * time.Millisecond}}})
	resp, err := r.Chat(t.Context(), withModel(hello(), "local/m"), nil)
	if err != nil || len(resp.Meta.Attempts) != 1 || resp.Meta.Attempts[0].Kind != models.KindTimeout {
		t.Errorf("Chat() = %+v, %v; want one timed-out attempt, then success", resp.Meta, err)
	}
}

func TestRouterStreamCutRestarts(t *testing.T) {
	local := newFake("local", "m")
	local.reply = func(ctx context.Context, n int, _ models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		if n == 1 {
			onDelta(models.Delta{Content: "half an ans"})
			return models.ChatResponse{}, &models.Error{Kind: models.KindNetwork, Msg: "stream cut"}
		}
		return answer(onDelta, "a whole answer"), nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	var got []models.Delta
	resp, err := r.Chat(t.Context(), withModel(hello(), "local/m"), func(d models.Delta) { got = append(got, d) })
	if err != nil {
		t.Fatal(err)
	}
	// Replaying the deltas, honoring Restart, must give the final content.
	var b strings.Builder
	for _, d := range got {
		if d.Restart {
			b.Reset()
		}
		b.WriteString(d.Content)
	}
	if b.String() != resp.Message.Content || !got[1].Restart {
		t.Errorf("deltas %+v replay to %q, want %q with Restart on the first delta of the retry", got, b.String(), resp.Message.Content)
	}
}

func TestRouterABSplit(t *testing.T) {
	a, b := newFake("a", "m"), newFake("b", "m")
	var x atomic.Int64
	r := router(t, models.RouterConfig{
		Providers: map[string]models.ProviderConfig{"a": {Provider: a}, "b": {Provider: b}},
		Routes:    []models.Route{{Name: "default", Targets: []models.Target{{Provider: "a", Model: "m", Weight: 3}, {Provider: "b", Model: "m", Weight: 1}}}},
		// A deterministic sequence spread evenly over [0, 1).
		Rand: func() float64 { return float64(x.Add(1)%100) / 100 },
	})
	variants := map[string]int{}
	for range 100 {
		resp, err := r.Chat(t.Context(), hello(), nil)
		if err != nil {
			t.Fatal(err)
		}
		variants[resp.Meta.Variant]++
		if resp.Meta.Variant != resp.Meta.Provider+"/m" {
			t.Fatalf("variant %q recorded, served by %q", resp.Meta.Variant, resp.Meta.Provider)
		}
	}
	if variants["a/m"] != 75 || variants["b/m"] != 25 {
		t.Errorf("split = %v, want 75/25 for weights 3:1", variants)
	}
}

func TestRouterConcurrencyCap(t *testing.T) {
	local := newFake("local", "m")
	local.reply = func(ctx context.Context, _ int, _ models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		time.Sleep(5 * time.Millisecond)
		return answer(onDelta, "ok"), nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local, MaxConcurrent: 2}}})
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, err := r.Chat(t.Context(), withModel(hello(), "local/m"), nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p := local.peak.Load(); p > 2 || p < 1 {
		t.Errorf("peak concurrency %d, want at most 2", p)
	}
}

func TestRouterRateLimitWaits(t *testing.T) {
	local := newFake("local", "m")
	// One request a second: the second call cannot start within 200 ms.
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local, RequestsPerMinute: 60}}})
	if _, err := r.Chat(t.Context(), withModel(hello(), "local/m"), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := r.Chat(ctx, withModel(hello(), "local/m"), nil)
	if err == nil || local.calls() != 1 {
		t.Errorf("second call within the rate = %v after %d calls, want it held back", err, local.calls())
	}
}

func TestRouterContextTooLongBeforeSending(t *testing.T) {
	local := newFake("local", "m")
	local.models[0].ContextLength = 100
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	req := withModel(hello(), "m")
	req.Messages[0].Content = strings.Repeat("word ", 200)
	_, err := r.Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrContextTooLong) || local.calls() != 0 {
		t.Errorf("Chat() = %v after %d calls, want ErrContextTooLong before sending", err, local.calls())
	}
}

type memLedger struct {
	mu    sync.Mutex
	spent map[string]int64
}

func (l *memLedger) DaySpent(_ context.Context, day string) (int64, float64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spent[day], 0, nil
}

func (l *memLedger) AddDaySpent(_ context.Context, day string, tokens int64, _ float64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spent[day] += tokens
	return nil
}

func TestRouterDailyBudgetPersists(t *testing.T) {
	local := newFake("local", "m")
	ledger := &memLedger{spent: map[string]int64{}}
	cfg := models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}, Day: models.Limits{Tokens: 100}, Ledger: ledger}
	req := withModel(hello(), "local/m")
	req.MaxTokens = 20
	if _, err := router(t, cfg).Chat(t.Context(), req, nil); err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Format(time.DateOnly)
	if ledger.spent[today] != 15 {
		t.Errorf("ledger has %d tokens for today, want the reported 15", ledger.spent[today])
	}
	ledger.spent[today] = 95 // as if earlier runs used the day up
	_, err := router(t, cfg).Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrBudgetExceeded) || !strings.Contains(err.Error(), "daily") {
		t.Errorf("Chat() with the day spent = %v, want the daily budget exceeded", err)
	}
}

func TestRouterCostAccounting(t *testing.T) {
	cloud := newFake("cloud", "gpt")
	r := router(t, models.RouterConfig{
		Providers:  map[string]models.ProviderConfig{"cloud": {Provider: cloud, Cloud: true, Prices: map[string]models.Price{"gpt": {InputPerMTok: 1, OutputPerMTok: 2}}}},
		AllowCloud: true,
	})
	req := withModel(hello(), "cloud/gpt")
	req.AllowCloud = true
	b := models.NewBudget("run", models.Limits{CostUSD: 1}, 0, 0)
	req.Budget = b
	resp, err := r.Chat(t.Context(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := (10*1.0 + 5*2.0) / 1e6
	if resp.Meta.CostUSD != want {
		t.Errorf("cost = %v, want %v", resp.Meta.CostUSD, want)
	}
	if _, usd := b.Spent(); usd != want {
		t.Errorf("budget spent $%v, want $%v", usd, want)
	}
}

func TestStructuredRepairs(t *testing.T) {
	const schema = `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`
	replies := []string{`{"n": "three"}`, `not json`, `{"n": 3}`}
	local := newFake("local", "m")
	local.reply = func(_ context.Context, n int, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
		if len(req.Format) == 0 {
			t.Errorf("request %d has no Format, want the schema (constrained decoding)", n)
		}
		return models.ChatResponse{Message: models.Message{Content: replies[min(n, len(replies))-1]}}, nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	res, err := models.Structured(t.Context(), r, withModel(hello(), "m"), json.RawMessage(schema), 2)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Value) != `{"n": 3}` || len(res.Attempts) != 3 || !strings.Contains(res.Attempts[0].Error, "/n") {
		t.Errorf("Structured() = %s after %+v", res.Value, res.Attempts)
	}
	last := local.requests[2].Messages
	if !strings.Contains(last[len(last)-1].Content, "not valid") {
		t.Errorf("repair request does not quote the error: %+v", last[len(last)-1])
	}

	res, err = models.Structured(t.Context(), r, withModel(hello(), "m"), json.RawMessage(`{"type":"array"}`), 1)
	if !errors.Is(err, models.ErrInvalidOutput) || len(res.Attempts) != 2 {
		t.Errorf("Structured(never valid) = %v after %d attempts, want ErrInvalidOutput after 2", err, len(res.Attempts))
	}
}

func TestSummarizeMapReduce(t *testing.T) {
	local := newFake("local", "m")
	local.reply = func(_ context.Context, _ int, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
		in := req.Messages[len(req.Messages)-1].Content
		if models.EstimateTokens(req.Messages, nil)+req.MaxTokens > 1024 {
			t.Errorf("a summarize call of %d bytes does not fit the 1024-token context", len(in))
		}
		return models.ChatResponse{Message: models.Message{Content: "S" + strings.Repeat("s", 200)}}, nil
	}
	r := router(t, models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	text := strings.Repeat("A paragraph of text about something.\n\n", 500) // ~19 KB
	sum, err := models.Summarize(t.Context(), r, models.SummarizeRequest{Chat: withModel(models.ChatRequest{}, "m"), Text: text, ContextLength: 1024, MaxTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rounds < 2 || sum.Calls < 8 || !strings.HasPrefix(sum.Text, "S") {
		t.Errorf("Summarize = %d rounds, %d calls, %q; want map-reduce over several chunks", sum.Rounds, sum.Calls, sum.Text[:10])
	}
}

// BenchmarkRouterOverhead measures what the router adds to a call whose
// provider costs nothing (24 streamed deltas, like the real-Ollama
// benchmark's reply), so the model's own time does not hide it.
func BenchmarkRouterOverhead(b *testing.B) {
	p := newFake("local", "m")
	words := strings.Repeat("tok ", 24)
	p.reply = func(_ context.Context, _ int, _ models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
		return answer(onDelta, words), nil
	}
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: p}}})
	if err != nil {
		b.Fatal(err)
	}
	req := withModel(hello(), "local/m")
	b.Run("provider", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.mu.Lock()
			p.requests = p.requests[:0]
			p.mu.Unlock()
			if _, err := p.Chat(b.Context(), req, func(models.Delta) {}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("router", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.mu.Lock()
			p.requests = p.requests[:0]
			p.mu.Unlock()
			if _, err := r.Chat(b.Context(), req, func(models.Delta) {}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestChatRequestLabelSet: a request's labels are its own, its
// messages', and private when it or a message is marked private.
func TestChatRequestLabelSet(t *testing.T) {
	tests := []struct {
		name string
		req  models.ChatRequest
		want []string
	}{
		{"none", hello(), nil},
		{"request", models.ChatRequest{Labels: []string{"secret", "pii"}}, []string{"pii", "secret"}},
		{"messages", models.ChatRequest{Messages: []models.Message{{Labels: []string{"pii"}}, {Labels: []string{"pii", "hr"}}}}, []string{"hr", "pii"}},
		{"private request", models.ChatRequest{Private: true, Labels: []string{"pii"}}, []string{"pii", "private"}},
		{"private message", models.ChatRequest{Messages: []models.Message{{Private: true}}}, []string{"private"}},
	}
	for _, tt := range tests {
		if got := tt.req.LabelSet(); !slices.Equal(got, tt.want) {
			t.Errorf("%s: LabelSet() = %q, want %q", tt.name, got, tt.want)
		}
	}
}
