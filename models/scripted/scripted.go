package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// ErrExhausted is returned, wrapped, by Chat when a conversation asks for
// more steps than its script has. A too-short script is a test bug, so it
// fails loudly instead of inventing an answer.
var ErrExhausted = errors.New("scripted: script exhausted")

// DefaultModel is the model a Provider serves when it is created with no
// models: it declares completion, native tools and structured output.
var DefaultModel = models.ModelInfo{
	Name:          "scripted",
	Provider:      "scripted",
	Capabilities:  []models.Capability{models.CapCompletion, models.CapTools, models.CapStructured},
	ContextLength: 32768,
}

// Step decides the reply to one model call. A Step is used once, in order,
// unless it is wrapped by Repeat. Steps are values; the same Step may
// appear in several scripts.
type Step struct {
	name   string
	reply  func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error)
	repeat bool
}

// String names the step for error messages.
func (s Step) String() string { return s.name }

// Answer replies with text as the final content.
func Answer(text string) Step {
	return Step{name: "answer", reply: func(context.Context, models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{Content: text}}, nil
	}}
}

// CallTool replies with one call of the tool name. argsJSON is used
// verbatim as the call's arguments (so a test can send invalid input on
// purpose); "" means {}. The call ID is assigned by the Provider.
func CallTool(name, argsJSON string) Step {
	if argsJSON == "" {
		argsJSON = "{}"
	}
	s := CallTools(keel.ToolCall{Name: name, Arguments: json.RawMessage(argsJSON)})
	s.name = "call " + name
	return s
}

// CallTools replies with the given tool calls in one message. Calls with
// an empty ID get one from the Provider.
func CallTools(calls ...keel.ToolCall) Step {
	calls = slices.Clone(calls)
	return Step{name: "call tools", reply: func(context.Context, models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{ToolCalls: slices.Clone(calls)}}, nil
	}}
}

// AnswerFunc replies with whatever f returns for the request. Fields f
// leaves empty get the Provider's defaults (model, role, usage, finish
// reason, tool call IDs); a non-nil error is returned, wrapped, by Chat.
func AnswerFunc(f func(req models.ChatRequest) (models.ChatResponse, error)) Step {
	return Step{name: "answer func", reply: func(_ context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		return f(req)
	}}
}

// ReplyFunc is AnswerFunc with the call's context, for steps that wait on
// something and must give up when the call is cancelled.
func ReplyFunc(f func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error)) Step {
	return Step{name: "reply func", reply: f}
}

// Fail makes the call return an error wrapping err, such as
// models.ErrUnavailable to exercise retries.
func Fail(err error) Step {
	return Step{name: "fail", reply: func(context.Context, models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{}, err
	}}
}

// Block makes the call wait until its context is done and return an error
// wrapping ctx.Err(), like a model that never finishes.
func Block() Step {
	return Step{name: "block", reply: func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
		<-ctx.Done()
		return models.ChatResponse{}, ctx.Err()
	}}
}

// Repeat returns s made permanent: it answers this call and every later
// one of its script, so steps after it are never reached.
func Repeat(s Step) Step {
	s.repeat = true
	s.name = "repeat " + s.name
	return s
}

// Goal returns the content of the first user message of req, the key
// ByGoal scripts on; "" when there is none.
func Goal(req models.ChatRequest) string {
	for _, m := range req.Messages {
		if m.Role == models.RoleUser {
			return m.Content
		}
	}
	return ""
}

// Provider is a scripted models.Provider. It is safe for concurrent use.
//
// Chat records the request, checks the model is served (else
// models.ErrModelNotFound), takes the next step of the conversation's
// script (else ErrExhausted) and runs it. The reply's content is streamed
// to onDelta in up to three fragments; cancelling ctx before the last
// fragment is delivered makes Chat return an error wrapping ctx.Err().
// Usage counts words (strings.Fields) of the request's messages and of the
// reply, tool call names and arguments included. Tool calls without an ID
// get "call_N", N counting from 1 across the Provider.
type Provider struct {
	models []models.ModelInfo
	script func(goal string) []Step // nil: one shared script

	mu       sync.Mutex
	shared   *cursor
	byGoal   map[string]*cursor
	calls    int // tool call IDs handed out
	requests []models.ChatRequest
	arrived  chan struct{} // closed, and replaced, when a request arrives
}

type cursor struct {
	steps []Step
	next  int
}

// New returns a Provider serving ms (DefaultModel when ms is empty; an
// empty Provider field becomes "scripted") whose
// calls all share one script: the first call, whatever its conversation,
// gets steps[0], the next steps[1], and so on.
func New(ms []models.ModelInfo, steps ...Step) *Provider {
	p := newProvider(ms)
	p.shared = &cursor{steps: slices.Clone(steps)}
	return p
}

// ByGoal returns a Provider serving ms (DefaultModel when ms is empty)
// that gives each conversation its own script: script is called once per
// distinct goal (see Goal), the first time a call with that goal arrives,
// and the conversation's calls then take its steps in order. Concurrent
// runs with distinct goals therefore never see each other's steps; runs
// that share a goal share its script. script is called with the
// Provider's lock held and must not call the Provider.
func ByGoal(ms []models.ModelInfo, script func(goal string) []Step) *Provider {
	p := newProvider(ms)
	p.script = script
	p.byGoal = make(map[string]*cursor)
	return p
}

func newProvider(ms []models.ModelInfo) *Provider {
	if len(ms) == 0 {
		ms = []models.ModelInfo{DefaultModel}
	}
	ms = slices.Clone(ms)
	for i := range ms {
		ms[i].Capabilities = slices.Clone(ms[i].Capabilities)
		if ms[i].Provider == "" {
			ms[i].Provider = "scripted"
		}
	}
	return &Provider{models: ms}
}

// Name returns "scripted".
func (p *Provider) Name() string { return "scripted" }

// Models returns the models the Provider was created with.
func (p *Provider) Models(ctx context.Context) ([]models.ModelInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scripted models: %w", err)
	}
	out := slices.Clone(p.models)
	for i := range out {
		out[i].Capabilities = slices.Clone(out[i].Capabilities)
	}
	return out, nil
}

// Requests returns a copy of every request Chat received, in arrival
// order, including those that then failed.
func (p *Provider) Requests() []models.ChatRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]models.ChatRequest, len(p.requests))
	for i, r := range p.requests {
		out[i] = cloneRequest(r)
	}
	return out
}

// WaitRequests waits until Chat has received at least n requests (see
// Requests) and returns them, or returns ctx's error once ctx is done.
// It is safe to call concurrently with Chat.
func (p *Provider) WaitRequests(ctx context.Context, n int) ([]models.ChatRequest, error) {
	for {
		p.mu.Lock()
		if len(p.requests) >= n {
			p.mu.Unlock()
			return p.Requests(), nil
		}
		if p.arrived == nil {
			p.arrived = make(chan struct{})
		}
		arrived := p.arrived
		p.mu.Unlock()
		select {
		case <-arrived:
		case <-ctx.Done():
			return nil, fmt.Errorf("scripted: waiting for %d requests: %w", n, ctx.Err())
		}
	}
}

// Chat answers req with the next step of its conversation's script.
func (p *Provider) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	step, n, err := p.next(ctx, req)
	if err != nil {
		return models.ChatResponse{}, err
	}
	resp, err := step.reply(ctx, req)
	if err != nil {
		return models.ChatResponse{}, fmt.Errorf("scripted step %d (%s): %w", n, step, err)
	}
	p.complete(req, &resp)

	if onDelta != nil {
		for _, frag := range fragments(resp.Message.Content, 3) {
			if err := ctx.Err(); err != nil {
				return models.ChatResponse{}, fmt.Errorf("scripted chat: %w", err)
			}
			onDelta(models.Delta{Content: frag})
		}
	}
	if err := ctx.Err(); err != nil {
		return models.ChatResponse{}, fmt.Errorf("scripted chat: %w", err)
	}
	return resp, nil
}

// next records req and picks its step; n is the step's 1-based position.
// A call whose ctx is already done uses up no step.
func (p *Provider) next(ctx context.Context, req models.ChatRequest) (Step, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, cloneRequest(req))
	if p.arrived != nil {
		close(p.arrived)
		p.arrived = nil
	}
	if err := ctx.Err(); err != nil {
		return Step{}, 0, fmt.Errorf("scripted chat: %w", err)
	}

	if req.Model == "" {
		return Step{}, 0, fmt.Errorf("scripted chat: no model named: %w", models.ErrInvalidRequest)
	}
	if !slices.ContainsFunc(p.models, func(m models.ModelInfo) bool { return m.Name == req.Model }) {
		return Step{}, 0, fmt.Errorf("scripted chat: model %q: %w", req.Model, models.ErrModelNotFound)
	}

	c, goal := p.shared, ""
	if c == nil {
		goal = Goal(req)
		c = p.byGoal[goal]
		if c == nil {
			c = &cursor{steps: p.script(goal)}
			p.byGoal[goal] = c
		}
	}
	if c.next >= len(c.steps) {
		if p.shared != nil {
			return Step{}, 0, fmt.Errorf("scripted chat: call %d, script has %d steps: %w", c.next+1, len(c.steps), ErrExhausted)
		}
		return Step{}, 0, fmt.Errorf("scripted chat: goal %q: call %d, script has %d steps: %w", goal, c.next+1, len(c.steps), ErrExhausted)
	}
	step, n := c.steps[c.next], c.next+1
	if !step.repeat {
		c.next++
	}
	return step, n, nil
}

// complete fills the fields a step left empty.
func (p *Provider) complete(req models.ChatRequest, resp *models.ChatResponse) {
	if resp.Model == "" {
		resp.Model = req.Model
	}
	if resp.Message.Role == "" {
		resp.Message.Role = models.RoleAssistant
	}
	if resp.FinishReason == "" {
		resp.FinishReason = "stop"
	}
	if len(resp.Message.ToolCalls) > 0 {
		resp.Message.ToolCalls = slices.Clone(resp.Message.ToolCalls)
		p.mu.Lock()
		for i := range resp.Message.ToolCalls {
			if resp.Message.ToolCalls[i].ID == "" {
				p.calls++
				resp.Message.ToolCalls[i].ID = fmt.Sprintf("call_%d", p.calls)
			}
		}
		p.mu.Unlock()
	}
	if resp.Usage == (models.Usage{}) {
		for _, m := range req.Messages {
			resp.Usage.PromptTokens += messageWords(m)
		}
		resp.Usage.CompletionTokens = messageWords(resp.Message)
	}
}

func messageWords(m models.Message) int {
	n := len(strings.Fields(m.Content))
	for _, c := range m.ToolCalls {
		n += len(strings.Fields(c.Name)) + len(strings.Fields(string(c.Arguments)))
	}
	return n
}

// fragments splits s into at most n non-empty pieces that concatenate to
// s, cutting only between runes.
func fragments(s string, n int) []string {
	r := []rune(s)
	if len(r) == 0 {
		return nil
	}
	size := (len(r) + n - 1) / n
	var out []string
	for len(r) > 0 {
		k := min(size, len(r))
		out = append(out, string(r[:k]))
		r = r[k:]
	}
	return out
}

func cloneRequest(r models.ChatRequest) models.ChatRequest {
	r.Messages = slices.Clone(r.Messages)
	for i := range r.Messages {
		r.Messages[i].ToolCalls = slices.Clone(r.Messages[i].ToolCalls)
	}
	r.Tools = slices.Clone(r.Tools)
	r.Format = slices.Clone(r.Format)
	return r
}
