package models

import (
	"context"
	"math"
	"strings"
	"testing"
)

func TestCalibration(t *testing.T) {
	var c Calibration
	if got := c.Tokens("m", 100); got != 100 {
		t.Errorf("Tokens before any observation = %d, want 100", got)
	}
	c.Observe("m", 100, 600) // a big fixed overhead: slope 1, base 500
	if got := c.Tokens("m", 300); got != 800 {
		t.Errorf("Tokens(300) after 100->600 = %d, want 800", got)
	}
	c.Observe("m", 300, 1100) // 2.5 tokens per estimated token, on a base of 350
	if got, want := c.Tokens("m", 500), 1600; got != want {
		t.Errorf("Tokens(500) after 100->600, 300->1100 = %d, want %d", got, want)
	}
	if got := c.Ratio("m"); math.Abs(got-2.5) > 1e-9 {
		t.Errorf("Ratio = %v, want 2.5", got)
	}
	if got := c.Tokens("other", 100); got != 100 {
		t.Errorf("Tokens of another model = %d, want 100", got)
	}
	// The fit errs high: every observation is on or under it.
	c.Observe("m", 200, 1000)
	for _, p := range [][2]int{{100, 600}, {300, 1100}, {200, 1000}} {
		if got := c.Tokens("m", p[0]); got < p[1] {
			t.Errorf("Tokens(%d) = %d, under the observed %d", p[0], got, p[1])
		}
	}
	c.Observe("m", 100, 0) // nothing reported: ignored
	c.Exceeded("n", 1000, 2048)
	if got := c.Tokens("n", 1000); got <= 2048 {
		t.Errorf("Tokens after a refusal at 2048 = %d, want over 2048", got)
	}
	var nilc *Calibration
	nilc.Observe("m", 1, 2)
	if got := nilc.Tokens("m", 7); got != 7 {
		t.Errorf("nil Calibration Tokens = %d, want 7", got)
	}
}

// refuser is a Chatter whose model refuses prompts over max bytes as too
// long for its context, as Ollama does with truncate false.
type refuser struct {
	max, calls, refused int
}

func (r *refuser) Chat(_ context.Context, req ChatRequest, _ func(Delta)) (ChatResponse, error) {
	r.calls++
	n := 0
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	if n > r.max {
		r.refused++
		return ChatResponse{}, &Error{Kind: KindContextTooLong, Msg: "the input length exceeds the context length"}
	}
	return ChatResponse{Message: Message{Role: RoleAssistant, Content: "s"}}, nil
}

// TestSummarizeShrinksRefusedChunks: when the model refuses a chunk the
// estimate said would fit, Summarize cuts smaller chunks instead of
// failing.
func TestSummarizeShrinksRefusedChunks(t *testing.T) {
	r := &refuser{max: 2500}
	text := strings.Repeat("word ", 4000) // 20000 bytes
	sum, err := Summarize(t.Context(), r, SummarizeRequest{Text: text, ContextLength: 2048, MaxTokens: 256})
	if err != nil {
		t.Fatalf("Summarize() error = %v after %d calls, %d refused", err, r.calls, r.refused)
	}
	if r.refused == 0 || sum.Text == "" {
		t.Errorf("Summarize() = %+v with %d refusals; want a summary after some", sum, r.refused)
	}
	// With the ratio known, chunks are small enough from the start.
	r = &refuser{max: 2500}
	if _, err := Summarize(t.Context(), r, SummarizeRequest{Text: text, ContextLength: 2048, MaxTokens: 256, Ratio: 2.5}); err != nil || r.refused != 0 {
		t.Errorf("Summarize(Ratio 2.5) = %v with %d refusals, want none", err, r.refused)
	}
}
