package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// loop drives one run to an end. It returns when the run reached a
// terminal state or was interrupted by shutdown; every exit path journals
// exactly one ending event.
func (e *Engine) loop(ctx context.Context, run keel.Run) {
	log := e.log.With("run", run.ID)
	specs := e.cfg.Tools.Specs()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventRunStarted,
		keel.RunStartedData{Goal: run.Goal, Model: run.Model, Tools: names, MaxSteps: run.MaxSteps},
		&keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		log.Error("journal run.started", "err", err)
		return
	}
	msgs := []models.Message{
		{Role: models.RoleSystem, Content: e.cfg.SystemPrompt},
		{Role: models.RoleUser, Content: run.Goal, Private: run.Policy.Private},
	}
	budget := models.NewBudget("run", models.Limits{Tokens: run.Policy.BudgetTokens, CostUSD: run.Policy.BudgetUSD}, 0, 0)
	for step := 1; step <= run.MaxSteps; step++ {
		resp, err := e.modelStep(ctx, run, step, models.ChatRequest{
			Model: run.Model, Messages: msgs, Tools: specs,
			AllowCloud: run.Policy.AllowCloud, Private: run.Policy.Private, Budget: budget,
		})
		if err != nil {
			e.end(ctx, run.ID, err)
			return
		}
		msgs = append(msgs, resp.Message)
		if len(resp.Message.ToolCalls) == 0 {
			e.end(ctx, run.ID, nil, resp.Message.Content)
			return
		}
		for _, call := range resp.Message.ToolCalls {
			out, err := e.toolStep(ctx, run, step, call)
			if err != nil {
				e.end(ctx, run.ID, err)
				return
			}
			msgs = append(msgs, models.Message{Role: models.RoleTool, ToolCallID: call.ID, ToolName: call.Name, Content: out, Private: run.Policy.Private})
		}
	}
	e.end(ctx, run.ID, fmt.Errorf("step limit reached: %d model calls without a final answer", run.MaxSteps))
}

// modelStep makes one model call as a span and journals its result.
func (e *Engine) modelStep(ctx context.Context, run keel.Run, step int, req models.ChatRequest) (models.ChatResponse, error) {
	sp := keel.Span{ID: "span_" + e.cfg.NewID(), RunID: run.ID, Kind: keel.SpanModelCall, Name: run.Model, Step: step, Start: e.cfg.Now()}
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	start := time.Now()
	resp, err := e.cfg.Model.Chat(ctx, req, func(d models.Delta) {
		if d.Content == "" {
			return
		}
		raw, _ := json.Marshal(keel.ModelDeltaData{Step: step, Content: d.Content, Restart: d.Restart})
		e.publish(keel.Event{RunID: run.ID, Type: keel.EventModelDelta, Time: e.cfg.Now(), Data: raw})
	})
	sp.Duration = time.Since(start)
	sp.Status = keel.SpanOK
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	sp.PromptTokens, sp.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason = resp.Meta.Provider, resp.Meta.CostUSD, resp.Meta.FirstByte, resp.Meta.Retries, resp.FinishReason
	if resp.Model != "" && resp.Model != sp.Name {
		sp.Name = resp.Model // the model a route chose
	}
	if m := resp.Meta; m.Route != "" || m.Variant != "" || len(m.Attempts) > 0 {
		sp.Attrs, _ = json.Marshal(struct {
			Route    string           `json:"route,omitempty"`
			Variant  string           `json:"variant,omitempty"`
			Attempts []models.Attempt `json:"attempts,omitempty"`
		}{m.Route, m.Variant, m.Attempts})
	}
	if ferr := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); ferr != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", ferr)
	}
	if err != nil {
		return models.ChatResponse{}, fmt.Errorf("model %s: %w", run.Model, err)
	}
	// Tool calls need IDs to pair results with; providers that give none get one.
	for i := range resp.Message.ToolCalls {
		if resp.Message.ToolCalls[i].ID == "" {
			resp.Message.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", step, i+1)
		}
	}
	resp.Message.Role = models.RoleAssistant
	if _, err := e.appendEvent(ctx, run.ID, keel.EventModelResult, keel.ModelResultData{
		Step: step, Model: resp.Model, Content: resp.Message.Content, ToolCalls: resp.Message.ToolCalls,
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens, DurationMS: sp.Duration.Milliseconds(),
	}, nil); err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	return resp, nil
}

// toolStep runs one tool call: intent journaled first, then the call as a
// span, then the result. A tool failure is not a run failure: the
// classified error goes back to the model, which may correct itself. It
// returns the content of the tool message for the model.
func (e *Engine) toolStep(ctx context.Context, run keel.Run, step int, call keel.ToolCall) (string, error) {
	if _, err := e.appendEvent(ctx, run.ID, keel.EventToolCall, keel.ToolCallData{Step: step, Call: call}, nil); err != nil {
		return "", fmt.Errorf("journal: %w", err)
	}
	sp := keel.Span{ID: "span_" + e.cfg.NewID(), RunID: run.ID, Kind: keel.SpanToolCall, Name: call.Name, Step: step, Start: e.cfg.Now()}
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return "", fmt.Errorf("journal: %w", err)
	}
	start := time.Now()
	out, err := e.cfg.Tools.Call(WithCaller(ctx, Caller{RunID: run.ID, Step: step, CallID: call.ID}), call.Name, call.Arguments)
	sp.Duration, sp.Status = time.Since(start), keel.SpanOK
	res := keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name, DurationMS: sp.Duration.Milliseconds()}
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	if ferr := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); ferr != nil {
		return "", fmt.Errorf("journal: %w", ferr)
	}
	if err != nil {
		if ctx.Err() != nil {
			// Cancelled or shutting down: the call did not complete; no result is recorded.
			return "", err
		}
		var te *keel.ToolError
		if !errors.As(err, &te) {
			te = &keel.ToolError{Code: keel.ToolCrashed, Message: err.Error()}
		}
		res.Error = te
	} else {
		res.Output = out
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventToolResult, res, nil); err != nil {
		return "", fmt.Errorf("journal: %w", err)
	}
	if res.Error != nil {
		b, _ := json.Marshal(map[string]any{"error": res.Error})
		return string(b), nil
	}
	return string(out), nil
}

// end journals the run's ending. err nil means success with result[0].
func (e *Engine) end(ctx context.Context, id keel.RunID, err error, result ...string) {
	var typ keel.EventType
	var data keel.RunEndData
	switch cause := context.Cause(ctx); {
	case err == nil:
		typ, data = keel.EventRunSucceeded, keel.RunEndData{Status: keel.RunSucceeded, Result: result[0]}
	case errors.Is(cause, errShutdown):
		typ, data = keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted, Reason: errShutdown.Error()}
	case errors.Is(cause, errCanceled):
		typ, data = keel.EventRunCancelled, keel.RunEndData{Status: keel.RunCancelled, Reason: errCanceled.Error()}
	default:
		typ, data = keel.EventRunFailed, keel.RunEndData{Status: keel.RunFailed, Reason: err.Error()}
	}
	if _, jerr := e.appendEvent(ctx, id, typ, data, &keel.RunUpdate{Status: data.Status, Result: data.Result, Error: data.Reason}); jerr != nil {
		e.log.Error("journal run end", "run", id, "event", typ, "err", jerr)
		return
	}
	e.log.Info("run ended", "run", id, "status", data.Status)
}
