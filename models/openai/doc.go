// Package openai owns the model layer's backend for servers speaking
// OpenAI's chat completions API: OpenAI itself, compatible cloud vendors,
// and local servers (llama.cpp, vLLM, LM Studio). Its Provider is a
// models.Provider and models.Embedder built on the official client
// github.com/openai/openai-go/v3.
//
// Compatible servers seldom describe their models, so a provider's models,
// with their capabilities, context length and price, are declared in its
// Config; Config.Discover adds those the server lists at GET /models.
// Config.Local says whether calls stay on this machine: by default they
// are treated as leaving it (ModelInfo.Cloud), which keeps private content
// away from them.
//
// The API key comes from an environment variable or the OS keyring, is
// looked up for each call (a missing key fails the call before anything is
// sent), and never appears in logs or errors: it is removed from whatever
// the server says. The client's own retries are off and it reads no
// OPENAI_* variable: the router retries, using the classification here.
//
// Every error is a *models.Error. Its Kind comes from the HTTP status
// (models.StatusKind) and the error code of the body
// (context_length_exceeded gives KindContextTooLong), with Retry-After
// parsed into RetryAfter; a refused or broken connection, or a stream that
// ends before the model's finish reason, is KindNetwork; a reply that is
// not the API's JSON is KindInvalidRequest; the caller's cancellation is
// KindCancelled wrapping ctx.Err().
//
// Package openaitest is an OpenAI-compatible test server with fault
// injection, for this package's tests and those of its users.
package openai
