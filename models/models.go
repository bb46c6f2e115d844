package models

import (
	"context"
	"encoding/json"
	"errors"

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
}

// Delta is a streamed fragment of a reply.
type Delta struct {
	Content string
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

// Errors callers branch on.
var (
	// ErrUnavailable: the provider could not be reached or failed; retry later.
	ErrUnavailable = errors.New("model provider unavailable")
	// ErrModelNotFound: the provider does not serve the named model.
	ErrModelNotFound = errors.New("model not found")
	// ErrInvalidRequest: the provider refused the request as malformed.
	ErrInvalidRequest = errors.New("invalid model request")
)
