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

// calibWindow is how many recent observations a Calibration keeps per
// model.
const calibWindow = 16

// maxSlope bounds a Calibration's tokens per estimated token.
const maxSlope = 16

// Calibration corrects EstimateTokens per model with the prompt token
// counts a provider reports (Ollama's prompt_eval_count). It fits the
// model's count as base + slope × estimate over the last 16 calls: the
// slope is how the model's tokenizer compares with the estimate (a tiny
// model's counts JSON at about a token a byte), the base what the
// provider adds that the estimate does not see (a template, a tool
// instruction). The fit errs high: the slope is at least 1 and the base
// puts every observation on or under the line. With one observation the
// slope is taken as 1; a count the provider refused as over its context
// (Exceeded) is recorded as one just over it.
//
// The zero value is ready to use; a nil *Calibration estimates raw. It is
// safe for concurrent use.
type Calibration struct {
	mu  sync.Mutex
	obs map[string][]calibPoint
}

type calibPoint struct{ est, got float64 }

// line returns the model's fit; ok is false when nothing was observed.
func (c *Calibration) line(model string) (base, slope float64, ok bool) {
	if c == nil {
		return 0, 1, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.obs[model]
	if len(ps) == 0 {
		return 0, 1, false
	}
	slope = 1
	if len(ps) > 1 {
		var me, mg float64
		for _, p := range ps {
			me, mg = me+p.est, mg+p.got
		}
		me, mg = me/float64(len(ps)), mg/float64(len(ps))
		var cov, v float64
		for _, p := range ps {
			cov += (p.est - me) * (p.got - mg)
			v += (p.est - me) * (p.est - me)
		}
		if v > 0 {
			slope = min(maxSlope, max(1, cov/v))
		}
	}
	base = math.Inf(-1)
	for _, p := range ps {
		base = max(base, p.got-slope*p.est)
	}
	return base, slope, true
}

// Ratio returns the model's tokens per estimated token (the fit's
// slope): 1 until something was observed.
func (c *Calibration) Ratio(model string) float64 {
	_, slope, _ := c.line(model)
	return slope
}

// Tokens returns the calibrated count of a prompt EstimateTokens puts at
// estimated tokens for model, rounded up; never less than estimated.
func (c *Calibration) Tokens(model string, estimated int) int {
	base, slope, ok := c.line(model)
	if !ok {
		return estimated
	}
	return max(estimated, int(math.Ceil(base+slope*float64(estimated))))
}

// Observe records that a prompt estimated at estimated tokens was
// reported as reported tokens by model's provider. Counts of 0 are
// ignored (a provider that reports nothing).
func (c *Calibration) Observe(model string, estimated, reported int) {
	if estimated <= 0 || reported <= 0 {
		return
	}
	c.add(model, calibPoint{float64(estimated), float64(reported)})
}

// Exceeded records that a prompt estimated at estimated tokens was
// refused as longer than limit tokens: it counts as a twentieth over.
func (c *Calibration) Exceeded(model string, estimated, limit int) {
	if estimated <= 0 {
		return
	}
	c.add(model, calibPoint{float64(estimated), math.Ceil(float64(limit+1) * 1.05)})
}

func (c *Calibration) add(model string, p calibPoint) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.obs == nil {
		c.obs = map[string][]calibPoint{}
	}
	ps := append(c.obs[model], p)
	if len(ps) > calibWindow {
		ps = ps[len(ps)-calibWindow:]
	}
	c.obs[model] = ps
}
