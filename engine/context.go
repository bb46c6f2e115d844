package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// Context assembly. Each model step sends the system prompt, the goal and
// the steps so far. When that no longer fits the model's context (an
// estimate: models.EstimateTokens), the older steps are summarized by the
// model into one message and the most recent steps are kept verbatim;
// the summary is journaled (context.summarized) before the step's model
// call, so a resumed run and a replay rebuild the same context without
// summarizing again.

// contextReserve is the share of the model's context kept free for the
// reply and for the tool list's estimate error.
const contextReserve = 0.25

// summaryIntro opens the message that stands for summarized steps.
const summaryIntro = "Summary of the earlier steps of this run (they no longer fit the context):\n"

// summaryMessage is the message that replaces summarized steps.
func summaryMessage(run keel.Run, text string) models.Message {
	return models.Message{Role: models.RoleUser, Content: summaryIntro + text, Private: run.Policy.Private}
}

// applySummary replaces the n messages after the system prompt and goal
// with the summary, as a context.summarized event says.
func applySummary(run keel.Run, msgs []models.Message, d keel.ContextSummaryData) ([]models.Message, error) {
	if d.Messages <= 0 || 2+d.Messages > len(msgs) {
		return nil, fmt.Errorf("context.summarized covers %d messages, the context has %d after the goal", d.Messages, len(msgs)-2)
	}
	out := append([]models.Message(nil), msgs[:2]...)
	out = append(out, summaryMessage(run, d.Summary))
	return append(out, msgs[2+d.Messages:]...), nil
}

// contextLength returns the context, in tokens, of the model the run uses;
// 0 when the model layer does not say (a route, say).
func (e *Engine) contextLength(ctx context.Context, run keel.Run) int {
	list, err := e.cfg.Model.Models(ctx)
	if err != nil {
		return 0
	}
	for _, m := range list {
		full := m.Provider + "/" + m.Name
		for _, n := range []string{m.Name, strings.TrimSuffix(m.Name, ":latest"), full, strings.TrimSuffix(full, ":latest")} {
			if n == run.Model {
				return m.ContextLength
			}
		}
	}
	return 0
}

// fitContext returns msgs fitted to the model's context for step: as they
// are when they fit, else with the older steps replaced by a journaled
// summary. limit is the model's context length (0: unknown, nothing is
// done).
func (e *Engine) fitContext(ctx context.Context, run keel.Run, step, limit int, msgs []models.Message, specs []keel.ToolSpec, budget *models.Budget) ([]models.Message, error) {
	if e.replaying {
		// A replay applies the journal's summaries; it has no model to ask.
		if d, ok := e.replaySummaries[step]; ok {
			return e.journalSummary(ctx, run, msgs, d)
		}
		return msgs, nil
	}
	if limit <= 0 {
		return msgs, nil
	}
	room := int(float64(limit) * (1 - contextReserve))
	before := models.EstimateTokens(msgs, specs)
	if before <= room {
		return msgs, nil
	}
	cut := summaryCut(msgs, specs, room/2)
	if cut <= 2 {
		return msgs, nil // nothing old enough to summarize: the model layer refuses what cannot fit
	}
	var text strings.Builder
	for _, m := range msgs[2:cut] {
		fmt.Fprintf(&text, "[%s] %s", m.Role, m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&text, " (calls %s with %s)", c.Name, c.Arguments)
		}
		text.WriteString("\n\n")
	}
	sp := keel.Span{ID: e.spanID(), RunID: run.ID, Kind: keel.SpanSummarize, Name: run.Model, Step: step, Start: e.cfg.Now()}
	_ = e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp)
	start := time.Now()
	sum, err := models.Summarize(ctx, e.cfg.Model, models.SummarizeRequest{
		Chat: models.ChatRequest{Model: run.Model, AllowCloud: run.Policy.AllowCloud, Private: run.Policy.Private, Budget: budget},
		Text: text.String(), ContextLength: limit, MaxTokens: max(128, limit/8),
		Focus: "what was tried, what the tools returned, what is decided and what is left to do for the goal: " + run.Goal,
	})
	sp.Duration, sp.Status = time.Since(start), keel.SpanOK
	sp.PromptTokens, sp.CompletionTokens = sum.Usage.PromptTokens, sum.Usage.CompletionTokens
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	_ = e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp)
	if err != nil {
		return nil, fmt.Errorf("summarize older steps to fit the context of %s: %w", run.Model, err)
	}
	out, _ := applySummary(run, msgs, keel.ContextSummaryData{Messages: cut - 2, Summary: sum.Text})
	d := keel.ContextSummaryData{Step: step, Messages: cut - 2, TokensBefore: before, TokensAfter: models.EstimateTokens(out, specs), Summary: sum.Text}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventContextSummary, d, nil); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return out, nil
}

// journalSummary applies a journaled summary and journals it again (the
// replay's own journal).
func (e *Engine) journalSummary(ctx context.Context, run keel.Run, msgs []models.Message, d keel.ContextSummaryData) ([]models.Message, error) {
	out, err := applySummary(run, msgs, d)
	if err != nil {
		return nil, err
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventContextSummary, d, nil); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return out, nil
}

// summaryCut returns the index of the first message to keep verbatim:
// the most recent messages that fit in keep tokens, starting at a step's
// model reply (never between a reply and its tool results).
func summaryCut(msgs []models.Message, specs []keel.ToolSpec, keep int) int {
	cut := len(msgs)
	for i := len(msgs) - 1; i > 2; i-- {
		if msgs[i].Role != models.RoleAssistant {
			continue
		}
		if models.EstimateTokens(msgs[i:], specs) > keep {
			break
		}
		cut = i
	}
	return cut
}
