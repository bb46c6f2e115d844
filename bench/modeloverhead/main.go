// Command modeloverhead measures what keel's model layer adds to a model
// call on the real Ollama, in one run on this machine. The same streamed
// chat request (same model, messages, num_ctx, num_predict, temperature 0
// and seed, so every reply is the same) is sent three ways, interleaved
// round by round so that drift in the machine's speed hits all three
// alike:
//
//   - direct: github.com/ollama/ollama/api's client, as a program that
//     talks to Ollama itself would;
//   - keel in process: models.Router over the Ollama provider (routing,
//     policy, budget reservation, limits, accounting);
//   - keel daemon: the models.chat method over the daemon's WebSocket,
//     deltas arriving as notifications;
//   - keel daemon, not streamed: the same without deltas (its "ttft" is
//     its total), which shows what delivering each delta costs.
//
// For each it prints time to first token and total time, p50 and p99, and
// what keel adds: the p50 of the per-round differences to the direct call
// (absolute, and as a share of the direct call's p50 total).
//
//	eval "$(../shared/ollama/start)"; go run ./bench/modeloverhead [-n 100] [-model keel-tiny]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
)

const (
	prompt    = "Name three colours of the rainbow."
	maxTokens = 24
	numCtx    = 2048
	seed      = 7
)

func main() {
	n := flag.Int("n", 100, "calls per way")
	model := flag.String("model", "keel-tiny", "Ollama model")
	flag.Parse()
	if err := run(*n, *model); err != nil {
		fmt.Fprintln(os.Stderr, "modeloverhead:", err)
		os.Exit(1)
	}
}

type sample struct{ ttft, total time.Duration }

type way struct {
	name    string
	call    func(ctx context.Context) (sample, string, error)
	samples []sample
}

func run(n int, model string) error {
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		return errors.New("OLLAMA_HOST is unset: start Ollama first (eval \"$(../shared/ollama/start)\")")
	}
	ctx := context.Background()
	base, err := url.Parse("http://" + host)
	if err != nil {
		return err
	}
	direct := api.NewClient(base, http.DefaultClient)
	zero := 0.0
	s := seed

	op, err := ollama.New(ollama.Config{Host: host})
	if err != nil {
		return err
	}
	defer op.Close()
	router, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: op}}})
	if err != nil {
		return err
	}
	req := models.ChatRequest{Model: model, Messages: []models.Message{{Role: models.RoleUser, Content: prompt}},
		MaxTokens: maxTokens, Temperature: &zero, Seed: &s}

	dir, err := os.MkdirTemp("", "keel-bench-models")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- daemon.Run(dctx, daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", OllamaHost: host,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(protocol.DaemonInfo) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		stop()
		return fmt.Errorf("daemon: %w", err)
	}
	defer func() { stop(); <-done }()
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return err
	}
	defer c.Close()

	ways := []*way{
		{name: "direct (ollama/api)", call: func(ctx context.Context) (sample, string, error) {
			stream := true
			areq := &api.ChatRequest{Model: model, Messages: []api.Message{{Role: "user", Content: prompt}}, Stream: &stream,
				KeepAlive: &api.Duration{Duration: ollama.DefaultKeepAlive},
				Options:   map[string]any{"num_ctx": numCtx, "num_predict": maxTokens, "temperature": zero, "seed": seed}}
			start := time.Now()
			var first time.Duration
			var text string
			err := direct.Chat(ctx, areq, func(r api.ChatResponse) error {
				if first == 0 && r.Message.Content != "" {
					first = time.Since(start)
				}
				text += r.Message.Content
				return nil
			})
			return sample{first, time.Since(start)}, text, err
		}},
		{name: "keel in process (Router)", call: func(ctx context.Context) (sample, string, error) {
			start := time.Now()
			var first time.Duration
			resp, err := router.Chat(ctx, req, func(d models.Delta) {
				if first == 0 && d.Content != "" {
					first = time.Since(start)
				}
			})
			return sample{first, time.Since(start)}, resp.Message.Content, err
		}},
		{name: "keel daemon (WebSocket)", call: func(ctx context.Context) (sample, string, error) {
			start := time.Now()
			var first time.Duration
			resp, err := c.Chat(ctx, protocol.ModelsChatParams{Model: model, Messages: []protocol.ChatMessage{{Role: "user", Content: prompt}},
				MaxTokens: maxTokens, Temperature: &zero, Seed: &s}, func(d protocol.ChatDelta) {
				if first == 0 && d.Content != "" {
					first = time.Since(start)
				}
			})
			return sample{first, time.Since(start)}, resp.Message.Content, err
		}},
		{name: "keel daemon, not streamed", call: func(ctx context.Context) (sample, string, error) {
			start := time.Now()
			resp, err := c.Chat(ctx, protocol.ModelsChatParams{Model: model, Messages: []protocol.ChatMessage{{Role: "user", Content: prompt}},
				MaxTokens: maxTokens, Temperature: &zero, Seed: &s}, nil)
			total := time.Since(start)
			return sample{total, total}, resp.Message.Content, err
		}},
	}

	// Warm up: load the model, fill caches; all must give the same text.
	var texts []string
	for _, w := range ways {
		for range 2 {
			if _, _, err := w.call(ctx); err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
		}
		_, text, _ := w.call(ctx)
		texts = append(texts, text)
	}
	same := true
	for _, t := range texts[1:] {
		same = same && t == texts[0]
	}
	for i := range n {
		for j := range ways {
			w := ways[(i+j)%len(ways)] // rotate the order each round
			smp, _, err := w.call(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			w.samples = append(w.samples, smp)
		}
	}

	fmt.Printf("model %s, prompt %q, num_predict %d, temperature 0, seed %d; n=%d per way, interleaved\n", model, prompt, maxTokens, seed, n)
	fmt.Printf("same reply from every way: %v (%q)\n\n", same, texts[0])
	fmt.Printf("%-28s %12s %12s %12s %12s\n", "", "ttft p50", "ttft p99", "total p50", "total p99")
	for _, w := range ways {
		t, tot := pcts(w.samples, func(s sample) time.Duration { return s.ttft }), pcts(w.samples, func(s sample) time.Duration { return s.total })
		fmt.Printf("%-28s %12s %12s %12s %12s\n", w.name, t[0], t[1], tot[0], tot[1])
	}
	// What keel adds, paired by round: the same round's direct call is
	// the baseline, so the model's own drift (large on a busy 2-core
	// machine) cancels out. p50 of the per-round differences.
	directSamples := ways[0].samples
	baseTotal := pcts(directSamples, func(s sample) time.Duration { return s.total })[0]
	fmt.Println()
	for _, w := range ways[1:] {
		dt := make([]sample, len(w.samples))
		for i, smp := range w.samples {
			dt[i] = sample{ttft: smp.ttft - directSamples[i].ttft, total: smp.total - directSamples[i].total}
		}
		t := pcts(dt, func(s sample) time.Duration { return s.ttft })
		tot := pcts(dt, func(s sample) time.Duration { return s.total })
		fmt.Printf("%-28s adds, p50 of per-round differences: ttft %+v, total %+v (%+.2f%% of direct's p50 total %v)\n",
			w.name, t[0], tot[0], 100*float64(tot[0])/float64(baseTotal), baseTotal)
	}
	return nil
}

// pcts returns p50 and p99 of f over ss.
func pcts(ss []sample, f func(sample) time.Duration) [2]time.Duration {
	v := make([]time.Duration, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return v[min(len(v)-1, int(q*float64(len(v))))].Round(time.Microsecond) }
	return [2]time.Duration{at(0.50), at(0.99)}
}
