package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// Context assembly. Each model step sends the system prompt, the goal,
// the steps so far and the human messages the step reads. When that no
// longer fits the model's context, the older steps are summarized by the
// model into one message and the most recent steps are kept verbatim;
// the newest step always is, and when its tool results alone do not fit
// they are cut, each with a note. The summary and the cuts are journaled
// (context.summarized) before the step's model call, so a resumed run and
// a replay rebuild the same context without summarizing again.
//
// Sizes are models.EstimateTokens calibrated per model with the prompt
// tokens the model reported for earlier steps (models.Calibration): a
// tiny model's tokenizer counts about twice the estimate. A step the
// model layer still refuses as too long (context_too_long: the provider
// counted more) raises the calibration and is fitted and sent again, at
// most refitLimit times; a context that cannot be fitted fails the run
// with context_too_long before anything is sent.

// contextReserve is the share of the model's context kept free for the
// reply and for the tool list's estimate error.
const contextReserve = 0.25

// refitLimit bounds how often one step is fitted again after the model
// layer refused it as too long.
const refitLimit = 2

// summaryIntro opens the message that stands for summarized steps.
const summaryIntro = "Summary of the earlier steps of this run (they no longer fit the context):\n"

// summaryMessage is the message that replaces summarized steps: it
// carries the labels of the context it was made from.
func summaryMessage(d keel.ContextSummaryData) models.Message {
	return models.Message{Role: models.RoleUser, Content: summaryIntro + d.Summary, Labels: d.Labels}
}

// applySummary replaces the n messages after the system prompt and goal
// with the summary and cuts tool results, as a context.summarized event
// says.
func applySummary(run keel.Run, msgs []models.Message, d keel.ContextSummaryData) ([]models.Message, error) {
	if d.Messages < 0 || 2+d.Messages > len(msgs) || (d.Messages == 0 && len(d.Cuts) == 0) {
		return nil, fmt.Errorf("context.summarized covers %d messages, the context has %d after the goal", d.Messages, len(msgs)-2)
	}
	out := append([]models.Message(nil), msgs[:2]...)
	if d.Messages > 0 {
		out = append(out, summaryMessage(d))
	}
	out = append(out, msgs[2+d.Messages:]...)
	for _, c := range d.Cuts {
		i := slices.IndexFunc(out, func(m models.Message) bool { return m.Role == models.RoleTool && m.ToolCallID == c.CallID })
		if i < 0 {
			return nil, fmt.Errorf("context.summarized cuts the result of call %s, which the context does not hold", c.CallID)
		}
		out[i].Content = cutContent(out[i].Content, c.Keep)
	}
	return out, nil
}

// cutContent returns the first keep bytes of s (fewer, to end on a whole
// character) and a note that the rest was cut.
func cutContent(s string, keep int) string {
	if keep >= len(s) {
		return s
	}
	keep = max(keep, 0)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + fmt.Sprintf("\n[keel: the rest of this tool result, %d of its %d bytes, was cut to fit the model's context]", len(s)-keep, len(s))
}

// cutNoteSize bounds the bytes cutContent's note adds.
const cutNoteSize = 100

// contextLength returns the context, in tokens, of the model named name
// ("model" or "provider/model"); 0 when the model layer does not say (a
// route, say: its chosen target's is known once a step was served).
func (e *Engine) contextLength(ctx context.Context, name string) int {
	list, err := e.cfg.Model.Models(ctx)
	if err != nil {
		return 0
	}
	for _, m := range list {
		full := m.Provider + "/" + m.Name
		for _, n := range []string{m.Name, strings.TrimSuffix(m.Name, ":latest"), full, strings.TrimSuffix(full, ":latest")} {
			if n == name {
				return m.ContextLength
			}
		}
	}
	return 0
}

// fitFunc fits the context of a step (see fitContext).
type fitFunc func(ctx context.Context, run keel.Run, step int, model string, limit int, msgs, tail []models.Message, specs []keel.ToolSpec, budget *models.Budget) ([]models.Message, error)

// fitContext returns msgs fitted to the model's context for step, so
// that they and tail (the human messages the step reads, which stay
// verbatim and come after) fit: as they are when they fit, else with
// older steps replaced by a journaled summary and, if the newest step's
// tool results alone are too long, those cut. limit is the context
// length of model, the model that serves the run (0: unknown, nothing is
// done). It fails with context_too_long when nothing can make the
// context fit.
func (e *Engine) fitContext(ctx context.Context, run keel.Run, step int, model string, limit int, msgs, tail []models.Message, specs []keel.ToolSpec, budget *models.Budget) ([]models.Message, error) {
	if limit <= 0 {
		return msgs, nil
	}
	tokens := func(ms []models.Message) int {
		return e.calib.Tokens(model, models.EstimateTokens(slices.Concat(ms, tail), specs))
	}
	room := int(float64(limit) * (1 - contextReserve))
	before := tokens(msgs)
	if before <= room {
		return msgs, nil
	}
	d := keel.ContextSummaryData{Step: step, TokensBefore: before}
	out := msgs
	if cut := summaryCut(msgs, room/2, tokens); cut > 2 {
		// A summary derives from the context: it carries what the
		// context holds, and so does the request that makes it.
		labels := e.labelsNow(ctx, run)
		sum, err := e.summarize(ctx, run, step, model, limit, scopeLabels(msgs[2:cut], labels), labels, budget)
		if err != nil {
			return nil, err
		}
		d.Messages, d.Summary, d.Labels = cut-2, sum, labelNames(labels)
		out, _ = applySummary(run, msgs, d)
	}
	if over := tokens(out) - room; over > 0 {
		d.Cuts = newestCuts(out, over, e.calib.Ratio(model))
		if len(d.Cuts) > 0 {
			out, _ = applySummary(run, out, keel.ContextSummaryData{Cuts: d.Cuts})
		}
	}
	d.TokensAfter = tokens(out)
	if d.Messages > 0 || len(d.Cuts) > 0 {
		if _, err := e.appendEvent(ctx, run.ID, keel.EventContextSummary, d, nil); err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
	}
	if d.TokensAfter > limit {
		return nil, &models.Error{Kind: models.KindContextTooLong, Model: model,
			Msg: fmt.Sprintf("step %d needs about %d tokens even with the earlier steps summarized and the newest tool results cut, and %s holds %d: the system prompt, goal or human messages are too long for it (nothing was sent)", step, d.TokensAfter, model, limit)}
	}
	return out, nil
}

// summarize asks the model for a summary of msgs, as a span.
func (e *Engine) summarize(ctx context.Context, run keel.Run, step int, model string, limit int, msgs []models.Message, labels policy.LabelSet, budget *models.Budget) (string, error) {
	var text strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&text, "[%s] %s", m.Role, m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&text, " (calls %s with %s)", c.Name, c.Arguments)
		}
		text.WriteString("\n\n")
	}
	sp := e.newSpan(run.ID, keel.SpanSummarize, run.Model, step)
	_ = e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp)
	start := e.cfg.Now()
	sum, err := models.Summarize(ctx, e.model(run, step), models.SummarizeRequest{
		// A summary of labelled content carries its labels.
		Chat: models.ChatRequest{Model: run.Model, AllowCloud: run.Policy.AllowCloud, Labels: models.ChatRequest{Labels: labelNames(labels), Messages: msgs}.LabelSet(), Budget: budget},
		Text: text.String(), ContextLength: limit, MaxTokens: max(128, limit/8), Ratio: e.calib.Ratio(model),
		Focus: "what was tried, what the tools returned, what is decided and what is left to do for the goal: " + run.Goal,
	})
	sp.Duration, sp.Status = e.cfg.Now().Sub(start), keel.SpanOK
	sp.PromptTokens, sp.CompletionTokens = sum.Usage.PromptTokens, sum.Usage.CompletionTokens
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	_ = e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp)
	if err != nil {
		return "", fmt.Errorf("summarize older steps to fit the context of %s: %w", model, err)
	}
	return sum.Text, nil
}

// recordedSummaries fits a step's context as the journal did: it applies
// the journal's summaries of the step (summaries, by step, in journal
// order) and journals them again, without asking the model. It stands
// for fitContext in a replay.
func (e *Engine) recordedSummaries(summaries map[int][]keel.ContextSummaryData) fitFunc {
	return func(ctx context.Context, run keel.Run, step int, _ string, _ int, msgs, _ []models.Message, _ []keel.ToolSpec, _ *models.Budget) ([]models.Message, error) {
		for _, d := range summaries[step] {
			out, err := applySummary(run, msgs, d)
			if err != nil {
				return nil, err
			}
			if _, err := e.appendEvent(ctx, run.ID, keel.EventContextSummary, d, nil); err != nil {
				return nil, fmt.Errorf("journal: %w", err)
			}
			msgs = out
		}
		return msgs, nil
	}
}

// summaryCut returns the index of the first message to keep verbatim:
// the newest step's model reply, or an earlier step's when the steps
// from there fit in keep tokens (never between a reply and its tool
// results). 2, the first message after the goal, means nothing to
// summarize.
func summaryCut(msgs []models.Message, keep int, tokens func([]models.Message) int) int {
	cut := 2
	for i := len(msgs) - 1; i > 2; i-- {
		if msgs[i].Role != models.RoleAssistant {
			continue
		}
		if cut > 2 && tokens(msgs[i:]) > keep {
			break
		}
		cut = i
	}
	return cut
}

// newestCuts returns the cuts that take about over tokens off the tool
// results of the newest step in msgs (those after its last model reply),
// longest first, each keeping at least its start, up to the end of a
// line when the part kept holds one. ratio converts
// estimated tokens to the model's.
func newestCuts(msgs []models.Message, over int, ratio float64) []keel.ContextCut {
	last := len(msgs)
	for last > 0 && msgs[last-1].Role != models.RoleAssistant {
		last--
	}
	results := slices.Clone(msgs[last:])
	slices.SortStableFunc(results, func(a, b models.Message) int { return len(b.Content) - len(a.Content) })
	// Bytes to take off, by the estimate's bytes per token.
	need := int(float64(over)*models.BytesPerToken/max(ratio, 1)) + 1
	var cuts []keel.ContextCut
	for _, m := range results {
		if need <= 0 {
			break
		}
		if m.Role != models.RoleTool {
			continue
		}
		take := min(need+cutNoteSize, len(m.Content)-cutNoteSize)
		if take <= 0 {
			continue
		}
		// What is kept ends at a line's end when it holds one: a result
		// of one item a line (knowledge_search's hits, each with its
		// citation) loses its last items whole, never half of one.
		keep := len(m.Content) - take
		if i := strings.LastIndexByte(m.Content[:keep], '\n'); i > 0 {
			keep = i + 1
			take = len(m.Content) - keep
		}
		cuts = append(cuts, keel.ContextCut{CallID: m.ToolCallID, Keep: keep})
		need -= take - cutNoteSize
	}
	return cuts
}
