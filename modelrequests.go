package keel

import "encoding/json"

// The model requests below are shared by the protocol (ipc/protocol
// aliases them as the params and results of models.list and
// models.chat) and the model layer that serves them (models.Service),
// so a request travels from the wire to the model layer without being
// copied field by field. What only the wire has (a request's id on a
// notification) stays in ipc/protocol.

// ChatMessage is one message of a models.chat conversation.
type ChatMessage struct {
	Role       string     `json:"role"` // system, user, assistant, tool
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// Images are base64 (in JSON) PNG or JPEG bytes for vision models.
	Images [][]byte `json:"images,omitempty"`
	// Private content never leaves the machine.
	Private bool `json:"private,omitempty"`
}

// ChatRequest asks the model layer for one reply, outside any run (the
// params of models.chat).
type ChatRequest struct {
	// Model names the model ("keel-tiny", "ollama/keel-tiny") or a route;
	// empty means the route "default".
	Model    string        `json:"model,omitempty"`
	Messages []ChatMessage `json:"messages"`
	Tools    []ToolSpec    `json:"tools,omitempty"`
	// Format, when set, is a JSON Schema the reply must satisfy; replies
	// that break it are repaired (asked again) at most Repairs times.
	Format      json.RawMessage `json:"format,omitempty"`
	Repairs     int             `json:"repairs,omitempty"`
	MaxTokens   int             `json:"max_tokens,omitempty"`
	Temperature *float64        `json:"temperature,omitempty"`
	Seed        *int            `json:"seed,omitempty"`
	AllowCloud  bool            `json:"allow_cloud,omitempty"`
	Private     bool            `json:"private,omitempty"`
	// Stream asks for models.chat.delta notifications.
	Stream bool `json:"stream,omitempty"`
}

// ChatDelta is a piece of a streamed reply, in order.
type ChatDelta struct {
	Content string
	// Restart voids the deltas before it (a retry after a broken stream).
	Restart bool
}

// ChatReply is the reply to a ChatRequest with its accounting (the
// result of models.chat).
type ChatReply struct {
	Model            string      `json:"model"`
	Provider         string      `json:"provider"`
	Message          ChatMessage `json:"message"`
	FinishReason     string      `json:"finish_reason,omitempty"`
	PromptTokens     int         `json:"prompt_tokens"`
	CompletionTokens int         `json:"completion_tokens"`
	CostUSD          float64     `json:"cost_usd,omitempty"`
	TTFTMS           float64     `json:"ttft_ms,omitempty"`
	LatencyMS        float64     `json:"latency_ms"`
	Retries          int         `json:"retries,omitempty"`
	Route            string      `json:"route,omitempty"`
	Variant          string      `json:"variant,omitempty"`
	// Attempts is how many replies a structured call took (repairs + 1).
	Attempts int `json:"attempts,omitempty"`
}

// ModelInfo is one model as models.list shows it.
type ModelInfo struct {
	Name         string   `json:"name"`
	Provider     string   `json:"provider"`
	Capabilities []string `json:"capabilities"` // such as "completion", "tools", "structured"
	// ContextLength is the context window in tokens; 0 when unknown.
	ContextLength int    `json:"context_length"`
	Size          int64  `json:"size,omitempty"` // bytes on disk, for a local model
	Family        string `json:"family,omitempty"`
}

// ProviderStatus says whether a model provider answered models.list.
type ProviderStatus struct {
	Name      string `json:"name"`
	Endpoint  string `json:"endpoint,omitempty"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	Hint      string `json:"hint,omitempty"` // what to do: when unreachable, or when it has no models
}

// ModelList is the models of every configured provider, and each
// provider's status (the result of models.list). A provider that does
// not answer contributes no models.
type ModelList struct {
	Models    []ModelInfo      `json:"models"`
	Providers []ProviderStatus `json:"providers"`
}

// PullProgress is one progress report of a model download. Status is the
// provider's own text; for Ollama "pulling manifest", then "pulling
// 8eeb52dfb3bb" for each layer (with Digest, Completed and Total set),
// "verifying sha256 digest", "writing manifest" and finally "success".
type PullProgress struct {
	Status    string
	Digest    string // the layer being downloaded; "" when none is
	Completed int64  // bytes of that layer downloaded so far
	Total     int64  // bytes of that layer; 0 when no download is under way
}
