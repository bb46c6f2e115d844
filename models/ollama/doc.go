// Package ollama owns the Ollama backend of the model layer: a
// models.Provider that lists local models with their capabilities and
// context length (/api/tags, /api/show), streams chat replies
// (/api/chat), pulls models from the registry with progress
// (/api/pull) and embeds text (/api/embed for several inputs,
// /api/embeddings, the cheaper call, for one, normalized alike), through
// the official github.com/ollama/ollama/api client.
//
// Tool calling works with every completion model. A model whose template
// renders tools (capability "tools") gets them natively; for any other
// model the provider lists the tools in a system instruction and
// constrains the reply with a JSON Schema (Ollama's "format", compiled to
// a grammar by llama.cpp) to either {"tool": NAME, "arguments": {...}} or
// {"answer": "..."}, and turns that reply into tool calls or content.
//
// Cancelling a call returns at once, but the reply is still read, and
// discarded, for up to Config.CancelDrain before the connection closes:
// Ollama v0.17.4 can hang for good when a client disconnects mid-stream.
// Close ends those background readers; the composition root calls it.
//
// Prompts are never cut: requests set truncate and shift false, so a
// prompt longer than num_ctx fails with models.ErrContextTooLong, and
// prompt sizes are calibrated per model with the prompt_eval_count of
// each reply (models.Calibration). Output schemas reach Ollama's grammar
// cut down to what it handles (grammarSchema); the caller validates the
// full schema.
//
// Errors wrap models.ErrUnavailable (Ollama unreachable or failing; a
// model runner that died is models.KindCrashed, not retried),
// models.ErrModelNotFound (not pulled), models.ErrContextTooLong or
// models.ErrInvalidRequest (refused as malformed), with a message that
// says what to do.
package ollama
