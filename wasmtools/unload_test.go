package wasmtools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// unloadedHook returns a Config hook reporting each unload on a channel.
func unloadedHook() (func(string), <-chan string) {
	ch := make(chan string, 1024)
	return func(name string) {
		select {
		case ch <- name:
		default:
		}
	}, ch
}

// waitUnload waits until name has been unloaded.
func waitUnload(t *testing.T, unloaded <-chan string, name string) {
	t.Helper()
	timeout := time.After(bound)
	for {
		select {
		case got := <-unloaded:
			if got == name {
				return
			}
		case <-timeout:
			t.Fatalf("%s was not unloaded within %v", name, bound)
		}
	}
}

// TestToolUnloadsWhenIdle: a tool not called for IdleToolTimeout gives
// up its compiled module, stays listed as it was, and the next call
// loads it again and is answered; a reactor (wordcount) and a command
// module (fixed).
func TestToolUnloadsWhenIdle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dir, tool, input, want string
	}{
		{bundledDir["wordcount"], "wordcount", `{"text":"one two three"}`, `"words":3`},
		{tinyDir, "fixed", `{}`, `{"greeting":"hi"}`},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			t.Parallel()
			hook, unloaded := unloadedHook()
			r := openRegistry(t, Config{Dir: tt.dir, IdleToolTimeout: time.Millisecond, testHookUnload: hook})
			before, ok := r.Tool(tt.tool)
			if !ok {
				t.Fatalf("Tool(%s) not found", tt.tool)
			}
			tl := r.set.Load().tools[tt.tool]
			for round := 1; round <= 2; round++ {
				// Loaded at Open (round 1) or by the last call, and idle.
				waitUnload(t, unloaded, tt.tool)
				if loaded, loads, unloads := tl.residency(); loaded || loads != round-1 || unloads < round {
					t.Fatalf("round %d: after an unload: loaded %v, %d loads again, %d unloads; want unloaded, %d loads, at least %d unloads", round, loaded, loads, unloads, round-1, round)
				}
				if got, _ := r.Tool(tt.tool); fmt.Sprint(got) != fmt.Sprint(before) {
					t.Errorf("Tool(%s) while unloaded = %+v, want it as loaded: %+v", tt.tool, got, before)
				}
				// A rescan keeps the unloaded tool as it is.
				if changed, err := r.Reload(context.Background()); err != nil || changed || r.set.Load().tools[tt.tool] != tl {
					t.Errorf("Reload while unloaded = %v, %v; want the tool kept, unchanged", changed, err)
				}
				out, err := r.Call(context.Background(), keel.ToolInvocation{Name: tt.tool, Args: json.RawMessage(tt.input)})
				if err != nil || !strings.Contains(string(out), tt.want) {
					t.Fatalf("round %d: Call(%s) after an unload = %s, %v; want %s", round, tt.tool, out, err, tt.want)
				}
				if _, loads, _ := tl.residency(); loads != round {
					t.Errorf("round %d: %d loads again after the call, want %d", round, loads, round)
				}
			}
		})
	}
}

// TestToolNotUnloaded: with a negative IdleToolTimeout, or without a
// CacheDir to load the module again from, a tool is never unloaded: its
// idle timer is never armed.
func TestToolNotUnloaded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative", Config{Dir: tinyDir, CacheDir: cacheDir, testCache: sharedCache, IdleToolTimeout: -1}},
		{"no cache", Config{Dir: tinyDir, IdleToolTimeout: time.Nanosecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := Open(context.Background(), tt.cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close(context.Background())
			if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed"}); err != nil {
				t.Fatalf("Call(fixed): %v", err)
			}
			tl := r.set.Load().tools["fixed"]
			tl.mu.Lock()
			defer tl.mu.Unlock()
			if tl.timer.t != nil || tl.compiled == nil {
				t.Errorf("fixed: idle timer %v, compiled %v; want no timer, loaded", tl.timer.t != nil, tl.compiled != nil)
			}
		})
	}
}

// TestUnloadConcurrentCalls: with a timeout so short that the tool
// unloads whenever no call holds it, concurrent calls still all succeed
// with the right answer: a call either holds the module or loads it
// again. Meaningful under -race.
func TestUnloadConcurrentCalls(t *testing.T) {
	t.Parallel()
	const workers, calls = 6, 15
	hook, unloaded := unloadedHook()
	r := openRegistry(t, Config{Dir: bundledDir["wordcount"], IdleToolTimeout: time.Nanosecond, IdleInstanceTimeout: time.Nanosecond, testHookUnload: hook})
	waitUnload(t, unloaded, "wordcount")
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for j := range calls {
				n := i*calls + j
				out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(fmt.Sprintf(`{"text":%q}`, strings.Repeat("w ", n)))})
				if err != nil {
					t.Errorf("Call(wordcount) %d: %v", n, err)
					return
				}
				var got struct{ Words int }
				if err := json.Unmarshal(out, &got); err != nil || got.Words != n {
					t.Errorf("wordcount(%d words) = %s", n, out)
				}
			}
		})
	}
	wg.Wait()
	if _, loads, _ := r.set.Load().tools["wordcount"].residency(); loads < 1 {
		t.Errorf("wordcount loaded again %d times, want at least once", loads)
	}
}

// BenchmarkCallAfterUnload measures the first call of a tool after it
// was unloaded: loading its module again from the compilation cache, a
// new instance, and the call.
func BenchmarkCallAfterUnload(b *testing.B) {
	hook, unloaded := unloadedHook()
	r, err := Open(context.Background(), Config{Dir: toolsDir, CacheDir: cacheDir, IdleToolTimeout: time.Nanosecond, testHookUnload: hook})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	input := json.RawMessage(`{"text":"the quick brown fox"}`)
	tl := r.set.Load().tools["wordcount"]
	wait := func() {
		for {
			if loaded, _, _ := tl.residency(); !loaded {
				return
			}
			<-unloaded
		}
	}
	for b.Loop() {
		b.StopTimer()
		wait()
		b.StartTimer()
		if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: input}); err != nil {
			b.Fatal(err)
		}
	}
}
