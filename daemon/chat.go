package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
)

// Chat serves models.chat: one call through the model router, streamed
// to onDelta; with a format, a structured call with repairs.
func (s *modelService) Chat(ctx context.Context, p protocol.ModelsChatParams, onDelta func(protocol.ChatDelta)) (protocol.ModelsChatResult, error) {
	if len(p.Messages) == 0 {
		return protocol.ModelsChatResult{}, fmt.Errorf("messages is empty: %w", keel.ErrInvalid)
	}
	req := models.ChatRequest{
		Model: p.Model, Tools: p.Tools, MaxTokens: p.MaxTokens, Temperature: p.Temperature, Seed: p.Seed,
		AllowCloud: p.AllowCloud, Private: p.Private,
	}
	for _, m := range p.Messages {
		switch models.Role(m.Role) {
		case models.RoleSystem, models.RoleUser, models.RoleAssistant, models.RoleTool:
		default:
			return protocol.ModelsChatResult{}, fmt.Errorf("message role %q: want system, user, assistant or tool: %w", m.Role, keel.ErrInvalid)
		}
		req.Messages = append(req.Messages, models.Message{Role: models.Role(m.Role), Content: m.Content, ToolCalls: m.ToolCalls,
			ToolCallID: m.ToolCallID, Images: m.Images, Private: m.Private})
	}
	var resp models.ChatResponse
	attempts := 0
	if len(p.Format) > 0 {
		res, err := models.Structured(ctx, s.router, req, p.Format, p.Repairs)
		if err != nil {
			return protocol.ModelsChatResult{}, modelError(err)
		}
		resp, attempts = res.Response, len(res.Attempts)
	} else {
		var stream func(models.Delta)
		if onDelta != nil {
			stream = func(d models.Delta) {
				if d.Content != "" {
					onDelta(protocol.ChatDelta{Content: d.Content, Restart: d.Restart})
				}
			}
		}
		var err error
		if resp, err = s.router.Chat(ctx, req, stream); err != nil {
			return protocol.ModelsChatResult{}, modelError(err)
		}
	}
	m := resp.Meta
	return protocol.ModelsChatResult{
		Model: resp.Model, Provider: m.Provider, FinishReason: resp.FinishReason,
		Message:      protocol.ChatMessage{Role: string(models.RoleAssistant), Content: resp.Message.Content, ToolCalls: resp.Message.ToolCalls},
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens,
		CostUSD: m.CostUSD, TTFTMS: protocol.Millis(m.FirstByte), LatencyMS: protocol.Millis(m.Latency),
		Retries: m.Retries, Route: m.Route, Variant: m.Variant, Attempts: attempts,
	}, nil
}

// modelError maps a model-layer failure onto the errors the protocol
// layer knows, keeping the classified message.
func modelError(err error) error {
	switch models.KindOf(err) {
	case models.KindInvalidRequest, models.KindContextTooLong, models.KindPolicy, models.KindBudget, models.KindInvalidOutput:
		return fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	case models.KindCancelled:
		return err
	}
	if errors.Is(err, keel.ErrInvalid) {
		return err
	}
	return fmt.Errorf("%w: %w", keel.ErrModelUnavailable, err)
}
