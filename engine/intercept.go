package engine

import (
	"context"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/models"
)

// interceptedModel is the engine's model as one call site sees it: each
// Chat passes Config.ModelInterceptors with the invocation that says
// which run step calls (see package intercept). A denied call fails with
// an *intercept.DeniedError and reaches no model.
type interceptedModel struct {
	e   *Engine
	run keel.Run
	inv keel.ModelInvocation
	// decided, when set, collects the policy's decisions about the
	// targets of each call (see admitModel).
	decided *[]keel.ModelDecision
}

// model returns the engine's model for the calls of run's step.
func (e *Engine) model(run keel.Run, step int) interceptedModel {
	return interceptedModel{e: e, run: run, inv: keel.ModelInvocation{Run: run.ID, Step: step, Model: run.Model}}
}

func (m interceptedModel) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	req.Admit = m.e.admitModel(ctx, m.run, req, m.decided)
	chain := m.e.cfg.ModelInterceptors
	if len(chain) == 0 {
		return m.e.cfg.Model.Chat(ctx, req, onDelta)
	}
	inv := m.inv
	if req.Model != "" {
		inv.Model = req.Model
	}
	var resp models.ChatResponse
	var err error
	o := chain.Call(ctx, inv, func(ctx context.Context) intercept.ModelOutcome {
		resp, err = m.e.cfg.Model.Chat(ctx, req, onDelta)
		return intercept.ModelOutcome{Model: resp.Model, Provider: resp.Meta.Provider, PromptTokens: resp.Usage.PromptTokens,
			CompletionTokens: resp.Usage.CompletionTokens, CostUSD: resp.Meta.CostUSD, FinishReason: resp.FinishReason, Err: err}
	})
	if err == nil && o.Err != nil {
		return models.ChatResponse{}, o.Err // denied
	}
	return resp, err
}
