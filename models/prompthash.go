package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// PromptHashes identifies the prompt of req, for a trace: template is
// the first 16 hex digits of the sha256 of its system prompt template
// (the content of its first message, when that is a system message; ""
// otherwise), full those of everything the model is sent, as JSON: the
// messages, the tool specs and the output schema (Format). Two calls
// with the same full hash sent the model the same prompt; the same
// template hash, the same instructions. A provider's own additions
// (Ollama's tool instruction for a model without native tool calling)
// are not part of either.
func PromptHashes(req ChatRequest) (template, full string) {
	if len(req.Messages) > 0 && req.Messages[0].Role == RoleSystem {
		sum := sha256.Sum256([]byte(req.Messages[0].Content))
		template = hex.EncodeToString(sum[:8])
	}
	h := sha256.New()
	// Encoding to a hash cannot fail but for values JSON cannot hold,
	// which these types do not have.
	_ = json.NewEncoder(h).Encode(struct {
		Messages []Message       `json:"messages"`
		Tools    any             `json:"tools,omitempty"`
		Format   json.RawMessage `json:"format,omitempty"`
	}{req.Messages, req.Tools, req.Format})
	return template, hex.EncodeToString(h.Sum(nil)[:8])
}
