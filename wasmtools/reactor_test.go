package wasmtools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// counter calls the hostile fixture's counter mode, which reports how
// many calls the instance has served.
func counter(t *testing.T, r *Registry, tool string) int {
	t.Helper()
	var got struct{ Calls int }
	out, err := r.Call(context.Background(), keel.ToolInvocation{Name: tool, Args: json.RawMessage(`{"mode":"counter"}`)})
	if err != nil {
		t.Fatalf("Call(%s, counter): %v", tool, err)
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("Call(%s, counter) = %s: %v", tool, out, err)
	}
	return got.Calls
}

func stats(t *testing.T, r *Registry, tool string) PoolStats {
	t.Helper()
	s, ok := r.PoolStats(tool)
	if !ok {
		t.Fatalf("PoolStats(%s): no pool; want %s loaded as a reactor", tool, tool)
	}
	return s
}

func TestReactorWarmCalls(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: bundledDir["wordcount"], MaxIdleInstances: 2})
	for i := range 200 {
		text := strings.Repeat("a b\n", i)
		out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(fmt.Sprintf(`{"text":%q}`, text))})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		var got struct{ Words, Lines, Chars int }
		if err := json.Unmarshal(out, &got); err != nil || got.Words != 2*i || got.Lines != i || got.Chars != 4*i {
			t.Fatalf("call %d: wordcount(%q) = %s, want %d words, %d lines, %d chars", i, text, out, 2*i, i, 4*i)
		}
	}
	// One caller at a time needs one instance.
	if s := stats(t, r, "wordcount"); s.Instantiations != 1 || s.Idle != 1 || s.IdleMemoryBytes == 0 {
		t.Errorf("PoolStats(wordcount) after 200 sequential calls = %+v, want 1 instantiation, 1 idle instance with memory", s)
	}
	if _, ok := r.PoolStats("nosuchtool"); ok {
		t.Error("PoolStats(nosuchtool) = ok")
	}
}

func TestReactorIsolation(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: reactorDir, MaxIdleInstances: 1})
	for i := 1; i <= 3; i++ {
		if got := counter(t, r, "hostile"); got != i {
			t.Errorf("pooled hostile counter call %d = %d, want %d (the same instance)", i, got, i)
		}
	}
	for i := 1; i <= 3; i++ {
		if got := counter(t, r, "freshhostile"); got != 1 {
			t.Errorf("fresh hostile counter call %d = %d, want 1 (a new instance each call)", i, got)
		}
	}
	if s := stats(t, r, "freshhostile"); s.Instantiations != 3 || s.Idle != 0 {
		t.Errorf("PoolStats(freshhostile) after 3 calls = %+v, want 3 instantiations and nothing idle", s)
	}
}

// TestReactorDiscard: after a call that fails for any reason but the
// tool's own error, its instance is gone (the next call sees a new one)
// and calls still work.
func TestReactorDiscard(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	r := openRegistry(t, Config{Dir: reactorDir, CallTimeout: time.Minute, MemoryLimitMiB: 64, MaxOutputBytes: 64 << 10, MaxIdleInstances: 1})
	short := openRegistry(t, Config{Dir: reactorDir, CallTimeout: timeout, MaxIdleInstances: 1})
	tests := []struct {
		name, input string
		code        keel.ToolErrorCode
		message     string
		kept        bool // the instance survives
	}{
		{"endless loop", `{"mode":"loop"}`, keel.ToolTimeout, "time limit", false},
		{"sleep", `{"mode":"sleep"}`, keel.ToolTimeout, "time limit", false},
		{"memory bomb", `{"mode":"oom"}`, keel.ToolResourceExhausted, "memory", false},
		{"one huge allocation", `{"mode":"bigalloc"}`, keel.ToolResourceExhausted, "memory", false},
		{"stack bomb", `{"mode":"stackbomb"}`, keel.ToolResourceExhausted, "memory", false},
		{"huge stdout", `{"mode":"spew"}`, keel.ToolResourceExhausted, "output", false},
		{"panic", `{"mode":"panic"}`, keel.ToolCrashed, "panic: boom", false},
		{"exit code", `{"mode":"exit"}`, keel.ToolCrashed, "code 3", false},
		{"exit 0 mid-call", `{"mode":"garbage"}`, keel.ToolCrashed, "code 0", false},
		{"own error", `{"mode":"fail"}`, keel.ToolFailed, "on_purpose", true},
		{"output breaks schema", `{"mode":"badoutput"}`, keel.ToolFailed, "contract", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := r
			if tt.code == keel.ToolTimeout {
				reg = short
			}
			before := counter(t, reg, "hostile")
			start := time.Now()
			terr := wantCode(t, reg, "hostile", tt.input, tt.code)
			if !strings.Contains(terr.Message, tt.message) {
				t.Errorf("%s error = %q, want it to mention %q", tt.name, terr.Message, tt.message)
			}
			if d := time.Since(start); tt.code == keel.ToolTimeout && d > timeout+time.Minute { // the guest loops or sleeps for an hour: only the limit ends it
				t.Errorf("%s took %v; the call timeout is %v", tt.name, d, timeout)
			}
			after := counter(t, reg, "hostile")
			switch {
			case tt.kept && after != before+2:
				t.Errorf("counter after %s = %d, want %d: the instance should be kept", tt.name, after, before+2)
			case !tt.kept && after != 1:
				t.Errorf("counter after %s = %d, want 1: the failed instance should be discarded", tt.name, after)
			}
		})
	}
}

func TestReactorConcurrent(t *testing.T) {
	t.Parallel()
	const workers, calls, idle = 16, 20, 3
	r := openRegistry(t, Config{Dir: bundledDir["wordcount"], MaxIdleInstances: idle})
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for j := range calls {
				text := strings.Repeat("w ", i*calls+j)
				out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(fmt.Sprintf(`{"text":%q}`, text))})
				if err != nil {
					t.Errorf("Call: %v", err)
					return
				}
				var got struct{ Words int }
				if err := json.Unmarshal(out, &got); err != nil || got.Words != i*calls+j {
					t.Errorf("wordcount(%d words) = %s", i*calls+j, out)
				}
			}
		})
	}
	wg.Wait()
	s := stats(t, r, "wordcount")
	// With 16 concurrent callers and 3 idle slots, an instance returned
	// to a full pool is closed and a later burst instantiates again, so
	// the count depends on scheduling; what must hold is that most calls
	// reused an instance (without a pool it would be workers × calls).
	if s.Idle > idle || s.Instantiations >= workers*calls/2 || s.Instantiations < 1 {
		t.Errorf("PoolStats after %d workers × %d calls = %+v, want at most %d idle and fewer than %d instantiations", workers, calls, s, idle, workers*calls/2)
	}
}

func BenchmarkCallWarm(b *testing.B) {
	r, err := Open(context.Background(), Config{Dir: toolsDir, CacheDir: cacheDir})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	input := json.RawMessage(`{"text":"the quick brown fox\njumps over the lazy dog\n"}`)
	if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: input}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: input}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallHost is BenchmarkCallWarm's input and output schemas on a
// reactor that does nothing (cannedReactor): the host's part of a warm
// call, from lookup and validation to the result, without guest code.
func BenchmarkCallHost(b *testing.B) { benchCallHost(b, nil) }

// BenchmarkCallHostTouched is BenchmarkCallHost with each call asking
// what it touched (keel.ToolInvocation.Touched), as a run's calls do:
// the price of the recording on a call that opens nothing.
func BenchmarkCallHostTouched(b *testing.B) { benchCallHost(b, new(keel.Touched)) }

func benchCallHost(b *testing.B, touched *keel.Touched) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "canned.wasm"), cannedReactor(`{"output":{"words":9,"lines":2,"chars":44}}`), 0o644); err != nil {
		b.Fatal(err)
	}
	manifest := `{"name":"canned","version":"0.1.0","description":"wordcount's contract, a canned answer","side_effects":"read_only",
		"input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false},
		"output_schema":{"type":"object","properties":{"words":{"type":"integer","minimum":0},"lines":{"type":"integer","minimum":0},"chars":{"type":"integer","minimum":0}},"required":["words","lines","chars"],"additionalProperties":false}}`
	if err := os.WriteFile(filepath.Join(dir, "canned.manifest.json"), []byte(manifest), 0o644); err != nil {
		b.Fatal(err)
	}
	r, err := Open(context.Background(), Config{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	input := json.RawMessage(`{"text":"the quick brown fox\njumps over the lazy dog\n"}`)
	out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "canned", Args: input})
	if err != nil || string(out) != `{"words":9,"lines":2,"chars":44}` {
		b.Fatalf("canned = %s, %v", out, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "canned", Args: input, Touched: touched}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPoolReleasesIdle: an instance idle for IdleInstanceTimeout is
// closed, by the pool's timer, and the next call makes a new one.
func TestPoolReleasesIdle(t *testing.T) {
	swept := make(chan *pool, 16)
	testHookSweep = func(p *pool) { swept <- p }
	t.Cleanup(func() { testHookSweep = nil })
	r := openRegistry(t, Config{Dir: bundledDir["wordcount"], IdleInstanceTimeout: 50 * time.Millisecond})
	p := r.set.Load().tools["wordcount"].pool
	call := func() {
		t.Helper()
		if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(`{"text":"a b"}`)}); err != nil {
			t.Fatalf("wordcount: %v", err)
		}
	}
	call()
	// The first sweep fires the timeout after the instance went idle.
	timeout := time.After(bound)
	for done := false; !done; {
		select {
		case got := <-swept:
			done = got == p
		case <-timeout:
			t.Fatalf("no sweep of wordcount's pool within %v", bound)
		}
	}
	if s := stats(t, r, "wordcount"); s.Idle != 0 || s.Instantiations != 1 {
		t.Errorf("PoolStats(wordcount) after the sweep = %+v, want nothing idle after 1 instantiation", s)
	}
	call()
	if s := stats(t, r, "wordcount"); s.Instantiations != 2 {
		t.Errorf("PoolStats(wordcount) after a call past the timeout = %+v, want a second instantiation", s)
	}
}
