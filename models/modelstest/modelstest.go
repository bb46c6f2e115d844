package modelstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// Limits of the suite. A call that streams must stop within
// CancelLatency of its context being cancelled.
const (
	CallTimeout   = 2 * time.Minute
	CancelLatency = 5 * time.Second
)

// UnknownModel is the model name the suite expects p not to serve.
const UnknownModel = "modelstest-no-such-model"

// FormatSchema is the JSON Schema the suite sends as ChatRequest.Format.
// Its values are bounded (a boolean, an integer), so even a tiny model
// finishes the object within the suite's token cap.
const FormatSchema = `{"type":"object","properties":{"ok":{"type":"boolean"},"count":{"type":"integer"}},"required":["ok","count"],"additionalProperties":false}`

// Tools are the tools the suite offers. A scripted provider that calls one
// must give arguments valid for its input schema.
var Tools = []keel.ToolSpec{
	{
		Name:        "lookup",
		Description: "Looks up a word in the dictionary and returns its definition.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"word":{"type":"string","enum":["cat","dog","ball"]}},"required":["word"],"additionalProperties":false}`),
		SideEffects: keel.SideEffectReadOnly,
	},
	{
		Name:        "add",
		Description: "Adds two integers.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`),
		SideEffects: keel.SideEffectReadOnly,
	},
}

// TestProvider checks that p serves model according to the
// models.Provider contract. model must be listed with CapCompletion.
// Subtests:
//
//   - Models: model is listed, every entry names p as its provider and
//     has a non-negative context length.
//   - Chat: the reply is an assistant message with content or tool calls,
//     the deltas concatenate to the content, usage is non-negative.
//   - Cancel: a call with a cancelled context, and a call cancelled at its
//     first delta, return errors wrapping context.Canceled, the latter
//     within CancelLatency and with no delta after the cancel.
//   - Format (models with CapStructured): the reply is JSON valid for
//     FormatSchema.
//   - Tools, ToolResult: with Tools offered, before and after a tool
//     result, the reply is content or calls of offered tools with unique
//     IDs and arguments valid for their schemas.
//   - UnknownModel: an error wrapping models.ErrModelNotFound.
//   - Concurrent: four calls at once all succeed.
//
// Requests cap MaxTokens so that a slow local model finishes quickly.
func TestProvider(t *testing.T, p models.Provider, model string) {
	t.Helper()
	if p.Name() == "" {
		t.Errorf("Name() = %q, want non-empty", p.Name())
	}
	info := listed(t, p, model)

	t.Run("Models", func(t *testing.T) {
		ctx := callContext(t)
		ms, err := p.Models(ctx)
		if err != nil {
			t.Fatalf("Models() error = %v", err)
		}
		for _, m := range ms {
			if m.Name == "" || m.Provider != p.Name() || m.ContextLength < 0 {
				t.Errorf("Models() has %+v, want a name, Provider %q and ContextLength >= 0", m, p.Name())
			}
		}
		if !info.Has(models.CapCompletion) {
			t.Errorf("Models() lists %s with capabilities %v, want %q among them", model, info.Capabilities, models.CapCompletion)
		}
	})

	t.Run("Chat", func(t *testing.T) {
		resp, deltas := chat(t, p, request(model, 32))
		if resp.Message.Content == "" && len(resp.Message.ToolCalls) == 0 {
			t.Errorf("Chat() = %+v, want content or tool calls", resp)
		}
		checkReply(t, resp, deltas, nil)
	})

	t.Run("Cancel", func(t *testing.T) {
		t.Run("Before", func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			deltas := 0
			_, err := p.Chat(ctx, request(model, 32), func(models.Delta) { deltas++ })
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Chat(cancelled ctx) error = %v, want context.Canceled", err)
			}
			if deltas != 0 {
				t.Errorf("Chat(cancelled ctx) streamed %d deltas, want 0", deltas)
			}
		})
		t.Run("MidStream", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), CallTimeout)
			defer cancel()
			var at time.Time
			deltas := 0
			_, err := p.Chat(ctx, request(model, 64), func(models.Delta) {
				deltas++
				if deltas == 1 {
					at = time.Now()
					cancel()
				}
			})
			if deltas == 0 {
				t.Fatalf("Chat() streamed no delta (error %v); cannot cancel mid-stream", err)
			}
			if deltas > 1 {
				t.Errorf("Chat() delivered %d deltas, want none after the cancel at the first", deltas)
			}
			if d := time.Since(at); d > CancelLatency {
				t.Errorf("Chat() returned %v after cancel, want within %v", d, CancelLatency)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Chat(cancelled mid-stream) error = %v, want context.Canceled", err)
			}
		})
	})

	t.Run("Format", func(t *testing.T) {
		if !info.Has(models.CapStructured) {
			t.Skipf("%s does not declare %q", model, models.CapStructured)
		}
		req := request(model, 256)
		req.Messages[1].Content = "Is the cat happy, and how many cats are there? Reply in JSON."
		req.Format = json.RawMessage(FormatSchema)
		resp, deltas := chat(t, p, req)
		checkReply(t, resp, deltas, nil)
		if err := CheckJSON(json.RawMessage(FormatSchema), []byte(resp.Message.Content)); err != nil {
			t.Errorf("Chat(Format) content %q: %v", resp.Message.Content, err)
		}
	})

	t.Run("Tools", func(t *testing.T) {
		req := request(model, 256)
		req.Messages[1].Content = "What does the word cat mean?"
		req.Tools = Tools
		resp, deltas := chat(t, p, req)
		checkReply(t, resp, deltas, Tools)
	})

	t.Run("ToolResult", func(t *testing.T) {
		req := request(model, 256)
		req.Messages = append(req.Messages[:1],
			models.Message{Role: models.RoleUser, Content: "What does the word cat mean?"},
			models.Message{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{
				{ID: "call_modelstest", Name: "lookup", Arguments: json.RawMessage(`{"word":"cat"}`)},
			}},
			models.Message{Role: models.RoleTool, ToolCallID: "call_modelstest", ToolName: "lookup",
				Content: `{"definition":"a small furry animal that says meow"}`},
		)
		req.Tools = Tools
		resp, deltas := chat(t, p, req)
		checkReply(t, resp, deltas, Tools)
	})

	t.Run("UnknownModel", func(t *testing.T) {
		_, err := p.Chat(callContext(t), request(UnknownModel, 8), nil)
		if !errors.Is(err, models.ErrModelNotFound) {
			t.Errorf("Chat(model %q) error = %v, want models.ErrModelNotFound", UnknownModel, err)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		ctx := callContext(t)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				req := request(model, 16)
				req.Messages[1].Content = fmt.Sprintf("Tell me story number %d.", i+1)
				var got strings.Builder
				resp, err := p.Chat(ctx, req, func(d models.Delta) { got.WriteString(d.Content) })
				if err != nil {
					t.Errorf("concurrent Chat() %d error = %v", i, err)
					return
				}
				if got.String() != resp.Message.Content {
					t.Errorf("concurrent Chat() %d deltas = %q, content %q", i, got.String(), resp.Message.Content)
				}
			})
		}
		wg.Wait()
	})
}

// CheckJSON returns an error unless doc is JSON valid for the JSON Schema
// schema. Provider tests use it on structured replies and tool arguments.
func CheckJSON(schema json.RawMessage, doc []byte) error {
	s, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("mem://schema.json", s); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	compiled, err := c.Compile("mem://schema.json")
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return compiled.Validate(v)
}

// listed returns model as p lists it, failing t when it is not.
func listed(t *testing.T, p models.Provider, model string) models.ModelInfo {
	t.Helper()
	ms, err := p.Models(callContext(t))
	if err != nil {
		t.Fatalf("Models() error = %v", err)
	}
	for _, m := range ms {
		if m.Name == model {
			return m
		}
	}
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	t.Fatalf("Models() = %v, want %q among them", names, model)
	return models.ModelInfo{}
}

func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), CallTimeout)
	t.Cleanup(cancel)
	return ctx
}

func request(model string, maxTokens int) models.ChatRequest {
	return models.ChatRequest{
		Model: model,
		Messages: []models.Message{
			{Role: models.RoleSystem, Content: "You are a helpful assistant who tells short stories."},
			{Role: models.RoleUser, Content: "Tell me a short story about a cat."},
		},
		MaxTokens: maxTokens,
	}
}

// chat calls p and returns the reply and the concatenated deltas.
func chat(t *testing.T, p models.Provider, req models.ChatRequest) (models.ChatResponse, string) {
	t.Helper()
	var deltas strings.Builder
	resp, err := p.Chat(callContext(t), req, func(d models.Delta) { deltas.WriteString(d.Content) })
	if err != nil {
		t.Fatalf("Chat() error = %v", err)
	}
	return resp, deltas.String()
}

// checkReply checks what every reply must satisfy; tools are those
// offered, against which tool calls are checked.
func checkReply(t *testing.T, resp models.ChatResponse, deltas string, tools []keel.ToolSpec) {
	t.Helper()
	if resp.Message.Role != models.RoleAssistant {
		t.Errorf("Chat() role = %q, want %q", resp.Message.Role, models.RoleAssistant)
	}
	if resp.Message.Content == "" && len(resp.Message.ToolCalls) == 0 {
		t.Errorf("Chat() = %+v, want content or tool calls", resp)
	}
	// Deltas carry the content; a provider that obtains tool calls as
	// constrained JSON streams that JSON instead.
	if len(resp.Message.ToolCalls) == 0 && len(tools) == 0 && deltas != resp.Message.Content {
		t.Errorf("Chat() deltas = %q, want the content %q", deltas, resp.Message.Content)
	}
	if resp.Usage.PromptTokens < 0 || resp.Usage.CompletionTokens < 0 {
		t.Errorf("Chat() usage = %+v, want non-negative counts", resp.Usage)
	}
	ids := map[string]bool{}
	for _, c := range resp.Message.ToolCalls {
		if c.ID == "" || ids[c.ID] {
			t.Errorf("Chat() tool call %+v: ID empty or repeated", c)
		}
		ids[c.ID] = true
		var spec *keel.ToolSpec
		for i := range tools {
			if tools[i].Name == c.Name {
				spec = &tools[i]
			}
		}
		if spec == nil {
			t.Errorf("Chat() calls tool %q, which was not offered", c.Name)
			continue
		}
		if err := CheckJSON(spec.InputSchema, c.Arguments); err != nil {
			t.Errorf("Chat() calls %s with arguments %s: %v", c.Name, c.Arguments, err)
		}
	}
}
