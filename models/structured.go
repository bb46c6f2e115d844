package models

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/keel-runtime/keel/schema"
)

// Chatter is what Structured and Summarize need of a model: a Provider or
// the Router.
type Chatter interface {
	Chat(ctx context.Context, req ChatRequest, onDelta func(Delta)) (ChatResponse, error)
}

// DefaultRepairs is how many times Structured asks again after a reply
// that breaks the schema.
const DefaultRepairs = 2

// StructuredAttempt records one reply Structured received.
type StructuredAttempt struct {
	Content string `json:"content"`
	// Error is why the reply was refused; "" for the accepted one.
	Error string   `json:"error,omitempty"`
	Usage Usage    `json:"usage"`
	Meta  CallMeta `json:"meta,omitzero"`
}

// StructuredResult is a schema-valid value and how it was obtained.
type StructuredResult struct {
	Value    json.RawMessage     `json:"value"`
	Response ChatResponse        `json:"response"` // the accepted reply
	Attempts []StructuredAttempt `json:"attempts"` // every reply, in order
	Usage    Usage               `json:"usage"`    // summed over attempts
}

// Structured asks c for a reply that is JSON valid against schemaJSON.
// The schema is sent as req.Format, so providers with constrained
// decoding (Ollama) produce valid JSON by construction; every reply is
// validated all the same. A reply that fails is answered with the
// validation error and the request is sent again, at most repairs times
// (negative: DefaultRepairs); after that the error wraps ErrInvalidOutput
// and the result still holds every attempt.
func Structured(ctx context.Context, c Chatter, req ChatRequest, schemaJSON json.RawMessage, repairs int) (StructuredResult, error) {
	sch, err := schema.Compile("models/structured", "schema", schemaJSON)
	if err != nil {
		return StructuredResult{}, &Error{Kind: KindInvalidRequest, Msg: "the output schema: " + err.Error()}
	}
	if repairs < 0 {
		repairs = DefaultRepairs
	}
	req.Format = schemaJSON
	req.Messages = append([]Message(nil), req.Messages...)
	var res StructuredResult
	for attempt := 0; ; attempt++ {
		resp, err := c.Chat(ctx, req, nil)
		if err != nil {
			return res, err
		}
		res.Usage.PromptTokens += resp.Usage.PromptTokens
		res.Usage.CompletionTokens += resp.Usage.CompletionTokens
		a := StructuredAttempt{Content: resp.Message.Content, Usage: resp.Usage, Meta: resp.Meta}
		problem := check(sch, resp.Message.Content)
		a.Error = problem
		res.Attempts = append(res.Attempts, a)
		if problem == "" {
			res.Value, res.Response = json.RawMessage(resp.Message.Content), resp
			return res, nil
		}
		if attempt >= repairs {
			return res, &Error{Kind: KindInvalidOutput, Model: resp.Model,
				Msg: fmt.Sprintf("%d replies broke the schema; the last: %s", attempt+1, problem)}
		}
		req.Messages = append(req.Messages,
			Message{Role: RoleAssistant, Content: resp.Message.Content},
			Message{Role: RoleUser, Content: "That reply is not valid: " + problem +
				". Reply again with only a JSON value that satisfies the schema, nothing else."})
	}
}

// check returns why content is not valid against sch, or "".
func check(sch *schema.Schema, content string) string {
	v, err := sch.Validate([]byte(content))
	switch {
	case err != nil:
		return "it is not JSON (" + err.Error() + ")"
	case v != nil && v.Pointer != "":
		return fmt.Sprintf("at %s: %s", v.Pointer, v.Message)
	case v != nil:
		return v.Message
	}
	return ""
}
