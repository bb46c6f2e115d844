package main

import (
	"strings"
	"strconv"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

type tools struct{}

var toolSpecs = []keel.ToolSpec{
	{Name: "echo", Description: "echo text", SideEffects: keel.SideEffectReadOnly,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
}

func (tools) Specs() []keel.ToolSpec { return slices.Clone(toolSpecs) }
func (tools) Call(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error) {
	return input, nil
}

type chain struct{ n int }

func (chain) Models(context.Context) ([]models.ModelInfo, error) {
	return []models.ModelInfo{scripted.DefaultModel}, nil
}
func (c chain) Chat(_ context.Context, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	done := 0
	for _, m := range req.Messages {
		if m.Role == models.RoleTool {
			done++
		}
	}
	msg := models.Message{Role: models.RoleAssistant}
	finish := "stop"
	if done < c.n-1 {
		msg.ToolCalls = []keel.ToolCall{{ID: fmt.Sprintf("call_%d", done+1), Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}}
		finish = "tool_calls"
	} else {
		msg.Content = "done"
	}
	return models.ChatResponse{Model: req.Model, FinishReason: finish, Message: msg,
		Usage: models.Usage{PromptTokens: 10, CompletionTokens: 5}}, nil
}

func main() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "prof")
	defer os.RemoveAll(dir)
	sync := os.Args[1]
	st, err := store.OpenWith(ctx, filepath.Join(dir, "k.db"), store.Options{Synchronous: sync})
	if err != nil {
		panic(err)
	}
	eng, _ := engine.New(engine.Config{Store: st, Model: chain{50}, Tools: tools{}, DefaultMaxSteps: 50})
	f, _ := os.Create(os.Args[2])
	runs := 60
	var t0 time.Time
	var c0, w0 int64
	for i := range runs {
		if i == 10 {
			pprof.StartCPUProfile(f)
			t0 = time.Now()
			c0 = st.Commits()
			w0 = wchar()
		}
		r, err := eng.Start(ctx, engine.StartRequest{Goal: "x"})
		if err != nil {
			panic(err)
		}
		eng.Wait(ctx, r.ID)
	}
	el := time.Since(t0)
	pprof.StopCPUProfile()
	fmt.Printf("per step %v, commits/step %.2f, bytes written per commit %d\n", el/time.Duration(50*(runs-10)), float64(st.Commits()-c0)/float64(50*(runs-10)), (wchar()-w0)/(st.Commits()-c0))
	eng.Close(ctx)
	st.Close()
}

func wchar() int64 {
	b, _ := os.ReadFile("/proc/self/io")
	var n int64
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "wchar:") {
			n, _ = strconv.ParseInt(strings.TrimSpace(l[6:]), 10, 64)
		}
	}
	return n
}
