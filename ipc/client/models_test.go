package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// modelsBackend is the fake backend with models: ListModels lists one,
// PullModel reports n progress steps for the model named, or fails for
// "nope".
type modelsBackend struct {
	*ipctest.Backend
	steps int
}

func (b modelsBackend) ListModels(context.Context) (protocol.ModelsListResult, error) {
	return protocol.ModelsListResult{
		Models:    []protocol.ModelInfo{{Name: "tiny", Provider: "fake", Capabilities: []string{"completion", "tools"}, ContextLength: 2048, Size: 1 << 20}},
		Providers: []protocol.ProviderStatus{{Name: "fake", Reachable: true}},
	}, nil
}

func (b modelsBackend) PullModel(_ context.Context, name string, progress func(keel.PullProgress)) error {
	if name == "nope" {
		return fmt.Errorf("no model nope in the registry: %w", keel.ErrInvalid)
	}
	for i := range b.steps {
		progress(keel.PullProgress{Status: "pulling " + name, Completed: int64(i + 1), Total: int64(b.steps)})
	}
	return nil
}

func TestListModels(t *testing.T) {
	c := dial(t, serve(t, modelsBackend{Backend: ipctest.New()}, ipc.Config{}))
	res, err := c.ListModels(ctx5s(t))
	want := protocol.ModelsListResult{
		Models:    []protocol.ModelInfo{{Name: "tiny", Provider: "fake", Capabilities: []string{"completion", "tools"}, ContextLength: 2048, Size: 1 << 20}},
		Providers: []protocol.ProviderStatus{{Name: "fake", Reachable: true}},
	}
	if diff := cmp.Diff(want, res); err != nil || diff != "" {
		t.Errorf("ListModels = %v (-want +got):\n%s", err, diff)
	}
}

// TestPullModelProgress runs pulls with more progress than the client
// buffers, two at once on one connection: each gets exactly its own
// progress, in order, before PullModel returns.
func TestPullModelProgress(t *testing.T) {
	const steps = 300
	c := dial(t, serve(t, modelsBackend{Backend: ipctest.New(), steps: steps}, ipc.Config{}))
	ctx := ctx5s(t)
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Go(func() {
			var got []int64
			res, err := c.PullModel(ctx, name, func(p protocol.ModelsPullProgress) {
				if p.Status != "pulling "+name {
					t.Errorf("pull %s got progress of another pull: %+v", name, p)
				}
				got = append(got, p.Completed) // no lock: called on PullModel's goroutine
			})
			if err != nil || res.Name != name {
				t.Errorf("PullModel(%s) = %+v, %v", name, res, err)
			}
			if len(got) != steps || got[0] != 1 || got[steps-1] != steps {
				t.Errorf("pull %s: %d progress reports (first %v), want 1..%d in order", name, len(got), got[:min(len(got), 3)], steps)
			}
			for i := 1; i < len(got); i++ {
				if got[i] != got[i-1]+1 {
					t.Errorf("pull %s: progress %d after %d", name, got[i], got[i-1])
					break
				}
			}
		})
	}
	wg.Wait()

	// A failed pull is a *protocol.Error, and nil progress is fine.
	var pe *protocol.Error
	if _, err := c.PullModel(ctx, "nope", nil); !errors.As(err, &pe) || pe.Code != protocol.CodeInvalidParams {
		t.Errorf("PullModel(nope) = %v, want code %d", err, protocol.CodeInvalidParams)
	}
}

// TestPullModelDeliversAllProgress makes the progress callback slow, so
// that a pull's reports and its response are all waiting when it
// returns: PullModel must still pass every report on before returning.
func TestPullModelDeliversAllProgress(t *testing.T) {
	const steps = 10 // fewer than the client buffers
	c := dial(t, serve(t, modelsBackend{Backend: ipctest.New(), steps: steps}, ipc.Config{}))
	ctx := ctx5s(t)
	for range 10 {
		n := 0
		_, err := c.PullModel(ctx, "m", func(p protocol.ModelsPullProgress) {
			if n == 0 {
				time.Sleep(20 * time.Millisecond) // the rest and the response arrive meanwhile
			}
			n++
		})
		if err != nil || n != steps {
			t.Fatalf("PullModel = %v after %d progress reports, want %d", err, n, steps)
		}
	}
}
