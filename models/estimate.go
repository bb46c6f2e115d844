package models

import "github.com/keel-runtime/keel"

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
