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
	// Ratio is the model's reported-to-estimated token ratio
	// (Calibration.Ratio), by which chunks are made smaller; below 1
	// counts as 1.
	Ratio float64
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
// at most 8 rounds). A chunk the model refuses as too long for its
// context (KindContextTooLong: the estimate was low) is cut in half and
// the round starts again, down to chunks of 256 bytes.
func Summarize(ctx context.Context, c Chatter, req SummarizeRequest) (Summary, error) {
	if req.MaxTokens <= 0 {
		req.MaxTokens = 512
	}
	if req.ContextLength <= 0 {
		return Summary{}, &Error{Kind: KindInvalidRequest, Msg: "summarize: the model's context length is unknown"}
	}
	const overhead = 128 // instruction and template tokens
	room := int(float64((req.ContextLength-req.MaxTokens-overhead)*BytesPerToken) / max(1, req.Ratio))
	if room < 256 {
		return Summary{}, &Error{Kind: KindContextTooLong, Msg: "summarize: the context is too small for a summary of that length"}
	}
	instr := "Summarize the following text. Keep facts, names, numbers and decisions; drop repetition."
	if req.Focus != "" {
		instr += " Focus on: " + req.Focus + "."
	}
	var sum Summary
	text := req.Text
	for round := 1; round <= 8; {
		sum.Rounds = round
		chunks := split(text, room)
		parts := make([]string, 0, len(chunks))
		shrunk := false
		for _, chunk := range chunks {
			cr := req.Chat
			cr.MaxTokens = req.MaxTokens
			cr.Tools, cr.Format = nil, nil
			cr.Messages = []Message{
				{Role: RoleSystem, Content: instr, Private: req.Chat.Private},
				{Role: RoleUser, Content: chunk, Private: req.Chat.Private},
			}
			resp, err := c.Chat(ctx, cr, nil)
			if err != nil && KindOf(err) == KindContextTooLong && room/2 >= 256 {
				room, shrunk = room/2, true
				break
			}
			if err != nil {
				return sum, err
			}
			sum.Calls++
			sum.Usage.PromptTokens += resp.Usage.PromptTokens
			sum.Usage.CompletionTokens += resp.Usage.CompletionTokens
			parts = append(parts, strings.TrimSpace(resp.Message.Content))
		}
		if shrunk {
			continue // the same round in smaller chunks
		}
		text = strings.Join(parts, "\n\n")
		if len(chunks) == 1 {
			sum.Text = text
			return sum, nil
		}
		round++
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
