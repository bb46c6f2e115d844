package models

import (
	"context"
	"errors"
	"strings"
)

// SummarizeRequest asks for a summary of a text that may be longer than
// the model's context.
type SummarizeRequest struct {
	// Chat carries the model or route, policy flags and budget; its
	// Messages are ignored.
	Chat ChatRequest
	Text string
	// ContextLength is the model's context in tokens (ModelInfo).
	ContextLength int
	// MaxTokens bounds each summary (default 512).
	MaxTokens int
	// Focus, when set, says what the summary must keep.
	Focus string
}

// Summary is the result of Summarize.
type Summary struct {
	Text   string `json:"text"`
	Calls  int    `json:"calls"`  // model calls made
	Rounds int    `json:"rounds"` // map-reduce rounds; 1 when the text fit at once
	Usage  Usage  `json:"usage"`
}

// Summarize condenses req.Text with c. Text that fits the context is
// summarized in one call; longer text is cut at paragraph or line breaks
// into chunks that fit, each chunk is summarized, and the joined
// summaries are summarized again until one call covers them (map-reduce,
// at most 8 rounds).
func Summarize(ctx context.Context, c Chatter, req SummarizeRequest) (Summary, error) {
	if req.MaxTokens <= 0 {
		req.MaxTokens = 512
	}
	if req.ContextLength <= 0 {
		return Summary{}, &Error{Kind: KindInvalidRequest, Msg: "summarize: the model's context length is unknown"}
	}
	const overhead = 128 // instruction and template tokens
	room := (req.ContextLength - req.MaxTokens - overhead) * BytesPerToken
	if room < 256 {
		return Summary{}, &Error{Kind: KindContextTooLong, Msg: "summarize: the context is too small for a summary of that length"}
	}
	instr := "Summarize the following text. Keep facts, names, numbers and decisions; drop repetition."
	if req.Focus != "" {
		instr += " Focus on: " + req.Focus + "."
	}
	var sum Summary
	text := req.Text
	for round := 1; round <= 8; round++ {
		sum.Rounds = round
		chunks := split(text, room)
		parts := make([]string, 0, len(chunks))
		for _, chunk := range chunks {
			cr := req.Chat
			cr.MaxTokens = req.MaxTokens
			cr.Tools, cr.Format = nil, nil
			cr.Messages = []Message{
				{Role: RoleSystem, Content: instr, Private: req.Chat.Private},
				{Role: RoleUser, Content: chunk, Private: req.Chat.Private},
			}
			resp, err := c.Chat(ctx, cr, nil)
			if err != nil {
				return sum, err
			}
			sum.Calls++
			sum.Usage.PromptTokens += resp.Usage.PromptTokens
			sum.Usage.CompletionTokens += resp.Usage.CompletionTokens
			parts = append(parts, strings.TrimSpace(resp.Message.Content))
		}
		text = strings.Join(parts, "\n\n")
		if len(chunks) == 1 {
			sum.Text = text
			return sum, nil
		}
	}
	return sum, errors.New("summarize: the summaries did not converge in 8 rounds; raise the context or lower MaxTokens")
}

// split cuts text into pieces of at most size bytes, preferring paragraph
// breaks, then line breaks, then spaces.
func split(text string, size int) []string {
	var out []string
	for len(text) > size {
		cut := -1
		for _, sep := range []string{"\n\n", "\n", " "} {
			if i := strings.LastIndex(text[:size], sep); i > size/2 {
				cut = i + len(sep)
				break
			}
		}
		if cut < 0 {
			cut = size
		}
		out = append(out, text[:cut])
		text = text[cut:]
	}
	return append(out, text)
}
