package models

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/keel-runtime/keel"
)

// Capability is something a model can do. Callers ask for capabilities,
// never for a vendor protocol.
type Capability string

// Capabilities a model may declare.
const (
	CapCompletion Capability = "completion" // chat / text generation
	CapTools      Capability = "tools"      // native tool calling
	CapVision     Capability = "vision"     // image input
	CapEmbedding  Capability = "embedding"  // embeddings
	CapStructured Capability = "structured" // output constrained to a JSON Schema
)

// ModelInfo describes one model a provider serves.
type ModelInfo struct {
	Name          string       `json:"name"`
	Provider      string       `json:"provider"`
	Capabilities  []Capability `json:"capabilities"`
	ContextLength int          `json:"context_length"` // tokens; 0 when unknown
	Family        string       `json:"family,omitempty"`
	Size          int64        `json:"size,omitempty"` // bytes on disk, when local
	// Digest is the model's version as its provider reports it (Ollama:
	// the manifest digest /api/tags lists); "" when unknown.
	Digest string `json:"digest,omitempty"`
	// Cloud is true when calls send data off this machine.
	Cloud bool `json:"cloud,omitempty"`
	// Price is what a call costs; nil means free (local inference).
	Price *Price `json:"price,omitempty"`
}

// Price is what a model charges, in US dollars per million tokens.
type Price struct {
	InputPerMTok  float64 `json:"input_per_mtok"`
	OutputPerMTok float64 `json:"output_per_mtok"`
}

// Cost returns the price of a call with the given token counts; a nil
// price costs nothing.
func (p *Price) Cost(prompt, completion int) float64 {
	if p == nil {
		return 0
	}
	return (float64(prompt)*p.InputPerMTok + float64(completion)*p.OutputPerMTok) / 1e6
}

// Has reports whether m declares capability c.
func (m ModelInfo) Has(c Capability) bool {
	for _, have := range m.Capabilities {
		if have == c {
			return true
		}
	}
	return false
}

// Role is the author of a chat message.
type Role string

// Message roles.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
)

// Message is one chat message. Assistant messages may carry tool calls;
// tool messages carry the result of the call named by ToolCallID.
type Message struct {
	Role       Role            `json:"role"`
	Content    string          `json:"content"`
	ToolCalls  []keel.ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolName   string          `json:"tool_name,omitempty"`
	// Images are attached pictures (PNG or JPEG bytes) for vision models.
	Images [][]byte `json:"images,omitempty"`
	// Private marks content that must never leave this machine: a
	// request holding a private message goes to local models only. It is
	// the label private (see Labels).
	Private bool `json:"private,omitempty"`
	// Labels are the data labels the message's content carries (see
	// package policy: "private", "secret", "pii" or a name of one's
	// own): where it came from, or for a message derived from a run's
	// context (a model's answer, a summary), the context's labels.
	// Sorted names; providers ignore them, the Router's check
	// (ChatRequest.Admit) sees them through ChatRequest.LabelSet.
	Labels []string `json:"labels,omitempty"`
}

// ChatRequest asks a model for the next message.
type ChatRequest struct {
	Model    string          `json:"model"`
	Messages []Message       `json:"messages"`
	Tools    []keel.ToolSpec `json:"tools,omitempty"`
	// Format, when set, is a JSON Schema the reply content must satisfy.
	Format json.RawMessage `json:"format,omitempty"`
	// MaxTokens caps the completion; 0 means the provider's default.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Temperature and Seed, when set, make sampling reproducible
	// (temperature 0 is greedy decoding).
	Temperature *float64 `json:"temperature,omitempty"`
	Seed        *int     `json:"seed,omitempty"`

	// The fields below are read by the Router; providers ignore them.

	// Route names the routing rule to use when Model is empty; empty
	// means the rule named "default".
	Route string `json:"route,omitempty"`
	// AllowCloud permits this call to go to a cloud model, where the
	// router's policy allows cloud at all. Default: local only.
	AllowCloud bool `json:"allow_cloud,omitempty"`
	// Private marks the whole request as private (see Message.Private).
	Private bool `json:"private,omitempty"`
	// Labels are data labels of the whole request, beyond its messages'
	// (see Message.Labels): the labels of the context it was built from.
	Labels []string `json:"labels,omitempty"`
	// Budget, when set, is charged for the call (a run's budget).
	Budget *Budget `json:"-"`
	// Admit, when set, is asked before the call goes to each target the
	// router tries, after the router's own cloud rules: an error keeps
	// the call from that target, nothing sent, as a policy refusal
	// (KindPolicy) that falls back to the route's next target. The
	// engine sets it to consult keel's policy. Nil admits every target.
	Admit func(provider, model string, cloud bool) error `json:"-"`
}

// labelPrivate is the label Private stands for.
const labelPrivate = "private"

// IsPrivate reports whether req, or any of its messages, is private:
// marked Private or carrying the label private.
func (req ChatRequest) IsPrivate() bool {
	if req.Private || slices.Contains(req.Labels, labelPrivate) {
		return true
	}
	for _, m := range req.Messages {
		if m.Private || slices.Contains(m.Labels, labelPrivate) {
			return true
		}
	}
	return false
}

// LabelSet returns every data label req carries: its Labels, each
// message's, and private when it IsPrivate. Sorted, without duplicates;
// nil for none. This is what a check of the request (Admit) decides on.
func (req ChatRequest) LabelSet() []string {
	var out []string
	out = append(out, req.Labels...)
	for _, m := range req.Messages {
		out = append(out, m.Labels...)
	}
	if req.IsPrivate() {
		out = append(out, labelPrivate)
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Usage counts the tokens of one call as the provider reported them.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// ChatResponse is a model's complete reply.
type ChatResponse struct {
	Model        string  `json:"model"`
	Message      Message `json:"message"`
	Usage        Usage   `json:"usage"`
	FinishReason string  `json:"finish_reason,omitempty"`
	// ModelDigest is the version of the model that replied, as its
	// provider reports it (Ollama: the hex digest /api/tags lists); ""
	// when the provider reports none.
	ModelDigest string `json:"model_digest,omitempty"`
	// Meta is how the call was served; the Router fills it in.
	Meta CallMeta `json:"meta,omitzero"`
}

// CallMeta is the accounting of one call through the Router: what served
// it, what it cost, how long it took and what was tried first.
type CallMeta struct {
	Provider  string        `json:"provider,omitempty"`
	Route     string        `json:"route,omitempty"`
	Variant   string        `json:"variant,omitempty"` // the A/B choice, "provider/model"
	CostUSD   float64       `json:"cost_usd,omitempty"`
	Latency   time.Duration `json:"latency_ns,omitempty"`
	FirstByte time.Duration `json:"ttft_ns,omitempty"` // time to the first streamed token
	Retries   int           `json:"retries,omitempty"`
	Attempts  []Attempt     `json:"attempts,omitempty"` // failed attempts before the answer
}

// Attempt is one failed try of a call.
type Attempt struct {
	Provider string        `json:"provider"`
	Model    string        `json:"model"`
	Kind     Kind          `json:"kind"`
	Error    string        `json:"error"`
	Duration time.Duration `json:"duration_ns"`
}

// Delta is a streamed fragment of a reply. Restart means the fragments
// streamed so far are void (the router retried after a broken stream)
// and the reply starts again with this delta.
type Delta struct {
	Content string
	Restart bool
}

// Embedder is implemented by providers that serve embeddings.
type Embedder interface {
	Embed(ctx context.Context, req EmbedRequest) (EmbedResponse, error)
}

// EmbedRequest asks for one vector per input text.
type EmbedRequest struct {
	Model   string   `json:"model"`
	Input   []string `json:"input"`
	Private bool     `json:"private,omitempty"`
}

// EmbedResponse holds a vector per input, in order.
type EmbedResponse struct {
	Model   string      `json:"model"`
	Vectors [][]float32 `json:"vectors"`
	Usage   Usage       `json:"usage"`
}

// Provider is a model backend. It is the plug-in point of the model layer;
// implementations must be safe for concurrent use.
type Provider interface {
	// Name is the provider's stable identifier, such as "ollama".
	Name() string

	// Models lists the models the provider serves with their
	// capabilities. It returns an error wrapping ErrUnavailable when the
	// provider cannot be reached.
	Models(ctx context.Context) ([]ModelInfo, error)

	// Chat sends req and returns the whole reply. When onDelta is not
	// nil it is called, from the calling goroutine, with each fragment
	// as it streams. Cancelling ctx stops generation and returns an
	// error wrapping ctx.Err(). When req.Tools is set and the model has
	// no native tool calling, the provider obtains tool calls some other
	// way (for example JSON constrained by a schema), so the reply
	// carries ToolCalls either way. Errors wrap ErrUnavailable,
	// ErrModelNotFound or ErrInvalidRequest where they apply.
	Chat(ctx context.Context, req ChatRequest, onDelta func(Delta)) (ChatResponse, error)
}
