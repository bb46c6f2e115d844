package models

import (
	"math"
	"sync"

	"github.com/keel-runtime/keel"
)

// BytesPerToken is the conservative ratio EstimateTokens assumes. Real
// tokenizers average 3.5–4.5 bytes per token on English text and code;
// assuming fewer bytes per token over-estimates, which is the safe side
// both for "does this prompt fit" and for reserving a budget.
const BytesPerToken = 3

// perMessage is the template overhead of one chat message (role markers,
// separators) in tokens.
const perMessage = 8

// EstimateTokens estimates the prompt tokens of messages and tools
// without a tokenizer, erring high.
func EstimateTokens(msgs []Message, tools []keel.ToolSpec) int {
	n := 0
	for _, m := range msgs {
		n += perMessage + (len(m.Content)+BytesPerToken-1)/BytesPerToken
		for _, c := range m.ToolCalls {
			n += (len(c.Name)+len(c.Arguments))/BytesPerToken + perMessage
		}
		n += 768 * len(m.Images) // one image tile, as vision models count it
	}
	for _, t := range tools {
		n += (len(t.Name)+len(t.Description)+len(t.InputSchema))/BytesPerToken + perMessage
	}
	return n
}

// Bounds of a Calibration's ratio.
const (
	minRatio = 1
	maxRatio = 16
)

// Calibration corrects EstimateTokens per model with the prompt token
// counts a provider reports (Ollama's prompt_eval_count): it keeps the
// ratio of reported to estimated tokens, which rises at once to a higher
// observation and falls halfway toward a lower one, and is never below 1
// (the raw estimate errs high for the usual tokenizers, and the checks
// that use it stay consistent with a calibrated one). A tiny model's
// tokenizer can need twice the estimate: without calibration its prompts
// look as if they fit when they do not.
//
// The zero value is ready to use; a nil *Calibration estimates raw. It is
// safe for concurrent use.
type Calibration struct {
	mu    sync.Mutex
	ratio map[string]float64
}

// Ratio returns the model's reported-to-estimated token ratio: 1 until
// something was observed.
func (c *Calibration) Ratio(model string) float64 {
	if c == nil {
		return 1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.ratio[model]; ok {
		return r
	}
	return 1
}

// Tokens returns the calibrated count of a prompt EstimateTokens puts at
// estimated tokens for model, rounded up.
func (c *Calibration) Tokens(model string, estimated int) int {
	return int(math.Ceil(float64(estimated) * c.Ratio(model)))
}

// Observe records that a prompt estimated at estimated tokens was
// reported as reported tokens by model's provider. Counts of 0 are
// ignored (a provider that reports nothing).
func (c *Calibration) Observe(model string, estimated, reported int) {
	if c == nil || estimated <= 0 || reported <= 0 {
		return
	}
	obs := float64(reported) / float64(estimated)
	c.set(model, func(old float64) float64 {
		if obs >= old {
			return obs
		}
		return (old + obs) / 2
	})
}

// Exceeded records that a prompt estimated at estimated tokens was
// refused as longer than limit tokens: the ratio rises so that it
// would have been counted over the limit, with a tenth to spare, and by
// at least a quarter.
func (c *Calibration) Exceeded(model string, estimated, limit int) {
	if c == nil || estimated <= 0 {
		return
	}
	c.set(model, func(old float64) float64 {
		return max(old*1.25, float64(limit+1)/float64(estimated)*1.1)
	})
}

func (c *Calibration) set(model string, next func(old float64) float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ratio == nil {
		c.ratio = map[string]float64{}
	}
	old, ok := c.ratio[model]
	if !ok {
		old = 1
	}
	c.ratio[model] = min(maxRatio, max(minRatio, next(old)))
}
