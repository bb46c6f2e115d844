package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// stuckTools are echoTools still loading that never finish: Specs
// returns only when its ctx ends.
type stuckTools struct{ echoTools }

func (*stuckTools) Loading() bool { return true }

func (t *stuckTools) Specs(ctx context.Context) []keel.ToolSpec {
	<-ctx.Done()
	return nil
}

// TestCancelWhileToolsLoad: a run queued while its tools load is waiting
// in Tools.Specs; cancelling it ends that wait, and the run ends
// cancelled instead of waiting for tools that may take minutes.
func TestCancelWhileToolsLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	model := scripted.New(nil, scripted.Repeat(scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{}, ctx.Err()
	})))
	eng, err := engine.New(engine.Config{Store: st, Model: model, Tools: &stuckTools{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := eng.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "wait for tools"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunCancelled {
		t.Errorf("run cancelled while its tools load ended %s, want %s", got.Status, keel.RunCancelled)
	}
}
