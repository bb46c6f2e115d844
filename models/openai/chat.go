package openai

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// Chat sends req to POST /chat/completions. With onDelta it streams the
// reply (asking for usage in the final chunk) and calls onDelta, from the
// calling goroutine, with each fragment of content; without, it asks for
// the whole reply at once, bounded by Config.Timeout.
//
// The request carries req.Tools as function tools, req.Format as a
// json_schema response format, and req.MaxTokens as max_tokens (or
// max_completion_tokens, see Config). Tool and format schemas that meet
// OpenAI's strict rules are sent with strict: true. Tools are sent to
// every model, declared with models.CapTools or not: the server refuses
// them if the model cannot call tools. A refusal (Structured Outputs) is
// returned as content. Tool calls without an ID get a random "call_…" one;
// arguments that are not JSON are returned as a JSON string, for the
// tool's input validation to report.
//
// Every error is a *models.Error. Cancelling ctx stops the stream at once
// and returns an error wrapping ctx.Err(), with no delta after the cancel.
// A stream that ends before the model's finish reason fails with
// KindNetwork, even when it ended cleanly.
func (p *Provider) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	if err := ctx.Err(); err != nil {
		return models.ChatResponse{}, p.ctxError(req.Model, err)
	}
	if err := p.serves(ctx, req.Model); err != nil {
		return models.ChatResponse{}, err
	}
	params, err := p.chatParams(req)
	if err != nil {
		return models.ChatResponse{}, p.errorf(models.KindInvalidRequest, req.Model, nil, "%v", err)
	}
	key, err := p.keys.key(ctx, p, req.Model)
	if err != nil {
		return models.ChatResponse{}, err
	}
	start := time.Now()
	var resp models.ChatResponse
	if onDelta == nil {
		resp, err = p.complete(ctx, key, params)
	} else {
		resp, err = p.stream(ctx, key, params, onDelta)
	}
	p.logChat(ctx, req.Model, onDelta != nil, time.Since(start), resp, err)
	if err != nil {
		return models.ChatResponse{}, err
	}
	return resp, nil
}

// stream runs a streamed chat completion.
func (p *Provider) stream(ctx context.Context, key string, params openai.ChatCompletionNewParams, onDelta func(models.Delta)) (models.ChatResponse, error) {
	model := string(params.Model)
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	var res *http.Response
	st := p.chatSvc.NewStreaming(ctx, params, p.callOptions(key, &res, nil)...)
	defer st.Close()

	var (
		content strings.Builder
		calls   toolCalls
		finish  string
		usage   models.Usage
		chunks  int
	)
	for ctx.Err() == nil && st.Next() {
		c := st.Current()
		chunks++
		if c.JSON.Usage.Valid() {
			usage = models.Usage{PromptTokens: int(c.Usage.PromptTokens), CompletionTokens: int(c.Usage.CompletionTokens)}
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue // only one choice is asked for
			}
			if text := ch.Delta.Content + ch.Delta.Refusal; text != "" && ctx.Err() == nil {
				content.WriteString(text)
				onDelta(models.Delta{Content: text})
			}
			calls.add(ch.Delta.ToolCalls)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return models.ChatResponse{}, p.ctxError(model, err)
	}
	if err := st.Err(); err != nil {
		return models.ChatResponse{}, p.classify(ctx, ctx, model, key, res, err)
	}
	if finish == "" {
		if chunks == 0 && res != nil {
			if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt != "text/event-stream" {
				return models.ChatResponse{}, p.invalidReply(model, fmt.Errorf("the reply's content type is %q, not text/event-stream", mt))
			}
		}
		return models.ChatResponse{}, p.errorf(models.KindNetwork, model, io.ErrUnexpectedEOF,
			"the reply stream from %s ended before the model finished; retry", p.BaseURL())
	}
	return models.ChatResponse{
		Model:        model,
		Message:      models.Message{Role: models.RoleAssistant, Content: content.String(), ToolCalls: calls.list()},
		Usage:        usage,
		FinishReason: finish,
	}, nil
}

// complete runs a chat completion that is not streamed.
func (p *Provider) complete(ctx context.Context, key string, params openai.ChatCompletionNewParams) (models.ChatResponse, error) {
	model := string(params.Model)
	tctx, cancel := p.withTimeout(ctx)
	defer cancel()
	var (
		res  *http.Response
		body []byte
		cc   openai.ChatCompletion
	)
	_, err := p.chatSvc.New(tctx, params, p.callOptions(key, &res, &body)...)
	if err != nil {
		return models.ChatResponse{}, p.classify(ctx, tctx, model, key, res, err)
	}
	if err := json.Unmarshal(body, &cc); err != nil {
		return models.ChatResponse{}, p.invalidReply(model, err)
	}
	for _, ch := range cc.Choices {
		if ch.Index != 0 {
			continue
		}
		msg := models.Message{Role: models.RoleAssistant, Content: ch.Message.Content + ch.Message.Refusal}
		for _, c := range ch.Message.ToolCalls {
			if c.Type == "" || c.Type == "function" {
				msg.ToolCalls = append(msg.ToolCalls, toolCall(c.ID, c.Function.Name, c.Function.Arguments))
			}
		}
		return models.ChatResponse{
			Model:        model,
			Message:      msg,
			Usage:        models.Usage{PromptTokens: int(cc.Usage.PromptTokens), CompletionTokens: int(cc.Usage.CompletionTokens)},
			FinishReason: ch.FinishReason,
		}, nil
	}
	return models.ChatResponse{}, p.invalidReply(model, errors.New("the reply has no choice"))
}

func (p *Provider) logChat(ctx context.Context, model string, stream bool, d time.Duration, resp models.ChatResponse, err error) {
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelDebug, "openai chat failed",
			slog.String(logkey.Provider, p.name), slog.String(logkey.Model, model), slog.Bool(logkey.Stream, stream),
			slog.Duration(logkey.Duration, d), slog.String(logkey.ErrKind, string(models.KindOf(err))), slog.String(logkey.Err, err.Error()))
		return
	}
	p.log.LogAttrs(ctx, slog.LevelDebug, "openai chat",
		slog.String(logkey.Provider, p.name), slog.String(logkey.Model, model), slog.Bool(logkey.Stream, stream),
		slog.Duration(logkey.Duration, d), slog.Int(logkey.PromptTokens, resp.Usage.PromptTokens),
		slog.Int(logkey.CompletionTokens, resp.Usage.CompletionTokens), slog.String(logkey.FinishReason, resp.FinishReason),
		slog.Int(logkey.ToolCalls, len(resp.Message.ToolCalls)))
}

// chatParams maps req to the API's request.
func (p *Provider) chatParams(req models.ChatRequest) (openai.ChatCompletionNewParams, error) {
	msgs, err := toMessages(req.Messages)
	if err != nil {
		return openai.ChatCompletionNewParams{}, err
	}
	params := openai.ChatCompletionNewParams{Model: openai.ChatModel(req.Model), Messages: msgs}
	if req.MaxTokens > 0 {
		if p.maxCompl {
			params.MaxCompletionTokens = openai.Int(int64(req.MaxTokens))
		} else {
			params.MaxTokens = openai.Int(int64(req.MaxTokens))
		}
	}
	if len(req.Tools) > 0 {
		if params.Tools, err = toTools(req.Tools); err != nil {
			return openai.ChatCompletionNewParams{}, err
		}
	}
	if len(req.Format) > 0 {
		if params.ResponseFormat, err = responseFormat(req.Format); err != nil {
			return openai.ChatCompletionNewParams{}, err
		}
	}
	return params, nil
}

// toMessages maps messages to the API's. Images go in user messages only,
// as data URLs; an assistant's tool calls keep their IDs, which the tool
// messages answering them carry as tool_call_id.
func toMessages(ms []models.Message) ([]openai.ChatCompletionMessageParamUnion, error) {
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(ms))
	for i, m := range ms {
		if len(m.Images) > 0 && m.Role != models.RoleUser {
			return nil, fmt.Errorf("message %d: images can be sent in user messages only, not %s", i, m.Role)
		}
		switch m.Role {
		case models.RoleSystem:
			out = append(out, openai.SystemMessage(m.Content))
		case models.RoleUser:
			if len(m.Images) == 0 {
				out = append(out, openai.UserMessage(m.Content))
				continue
			}
			var parts []openai.ChatCompletionContentPartUnionParam
			if m.Content != "" {
				parts = append(parts, openai.TextContentPart(m.Content))
			}
			for j, img := range m.Images {
				u, err := dataURL(img)
				if err != nil {
					return nil, fmt.Errorf("message %d, image %d: %w", i, j, err)
				}
				parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: u}))
			}
			out = append(out, openai.UserMessage(parts))
		case models.RoleAssistant:
			var a openai.ChatCompletionAssistantMessageParam
			if m.Content != "" || len(m.ToolCalls) == 0 {
				a.Content.OfString = openai.String(m.Content)
			}
			for _, c := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       c.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: argsText(c.Arguments)},
					},
				})
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		case models.RoleTool:
			if m.ToolCallID == "" {
				return nil, fmt.Errorf("message %d: a tool result needs the ToolCallID of the call it answers", i)
			}
			out = append(out, openai.ToolMessage(m.Content, m.ToolCallID))
		default:
			return nil, fmt.Errorf("message %d: unknown role %q", i, m.Role)
		}
	}
	return out, nil
}

// dataURL encodes a PNG, JPEG, GIF or WebP picture as a data URL.
func dataURL(img []byte) (string, error) {
	switch mt := http.DetectContentType(img); mt {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return "data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(img), nil
	default:
		return "", fmt.Errorf("the picture is %s, not PNG, JPEG, GIF or WebP", mt)
	}
}

// toTools maps tool specs to function tools.
func toTools(specs []keel.ToolSpec) ([]openai.ChatCompletionToolUnionParam, error) {
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(specs))
	for _, s := range specs {
		schema := s.InputSchema
		if t := bytes.TrimSpace(schema); len(t) == 0 || string(t) == "null" {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		var params openai.FunctionParameters
		if err := json.Unmarshal(schema, &params); err != nil || params == nil {
			return nil, fmt.Errorf("tool %s: the input schema is not a JSON object", s.Name)
		}
		fn := openai.FunctionDefinitionParam{Name: s.Name, Parameters: params}
		if s.Description != "" {
			fn.Description = openai.String(s.Description)
		}
		if strictOK(schema) {
			fn.Strict = openai.Bool(true)
		}
		out = append(out, openai.ChatCompletionFunctionTool(fn))
	}
	return out, nil
}

// responseFormat maps a JSON Schema to a json_schema response format.
func responseFormat(schema json.RawMessage) (openai.ChatCompletionNewParamsResponseFormatUnion, error) {
	var obj map[string]any
	if err := json.Unmarshal(schema, &obj); err != nil || obj == nil {
		return openai.ChatCompletionNewParamsResponseFormatUnion{}, errors.New("the format is not a JSON Schema object")
	}
	js := openai.ResponseFormatJSONSchemaJSONSchemaParam{Name: "reply", Schema: schema}
	if strictOK(schema) {
		js.Strict = openai.Bool(true)
	}
	return openai.ChatCompletionNewParamsResponseFormatUnion{
		OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{JSONSchema: js},
	}, nil
}

// argsText is a call's arguments as the API carries them: a JSON string.
func argsText(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "{}"
	}
	return string(raw)
}

// toolCalls accumulates the tool-call fragments of a stream. OpenAI sends
// a call's id and name in its first fragment and its arguments in pieces,
// each fragment with the call's index; some servers give every call index
// 0, so a new id there starts a new call.
type toolCalls struct {
	calls   []*pendingCall
	byIndex map[int64]*pendingCall
}

type pendingCall struct {
	id, name string
	args     strings.Builder
}

func (tc *toolCalls) add(frags []openai.ChatCompletionChunkChoiceDeltaToolCall) {
	for _, f := range frags {
		c := tc.byIndex[f.Index]
		if c == nil || (f.ID != "" && c.id != "" && f.ID != c.id) {
			c = &pendingCall{}
			if tc.byIndex == nil {
				tc.byIndex = map[int64]*pendingCall{}
			}
			tc.byIndex[f.Index] = c
			tc.calls = append(tc.calls, c)
		}
		if c.id == "" {
			c.id = f.ID
		}
		if c.name == "" {
			c.name = f.Function.Name
		}
		c.args.WriteString(f.Function.Arguments)
	}
}

func (tc *toolCalls) list() []keel.ToolCall {
	var out []keel.ToolCall
	for _, c := range tc.calls {
		out = append(out, toolCall(c.id, c.name, c.args.String()))
	}
	return out
}

// toolCall builds a call from the API's fields: a missing id becomes a
// random "call_…" one; arguments are compacted JSON, {} when empty, and a
// JSON string of the text when it is not JSON.
func toolCall(id, name, args string) keel.ToolCall {
	if id == "" {
		var b [6]byte
		rand.Read(b[:]) // never fails
		id = "call_" + hex.EncodeToString(b[:])
	}
	c := keel.ToolCall{ID: id, Name: name, Arguments: json.RawMessage("{}")}
	if t := strings.TrimSpace(args); t != "" {
		var buf bytes.Buffer
		if json.Compact(&buf, []byte(t)) == nil {
			c.Arguments = buf.Bytes()
		} else {
			c.Arguments, _ = json.Marshal(t)
		}
	}
	return c
}
