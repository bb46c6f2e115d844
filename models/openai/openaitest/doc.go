// Package openaitest owns an OpenAI-compatible test server: real HTTP over
// loopback (httptest), speaking the parts of the API that keel's openai
// provider uses, so that tests of that provider and of its users (the
// router, the engine) exercise the real client and transport.
//
// Unless scripted, the server answers like a small deterministic model
// (the "fake model"): it streams a short story word by word, cut at
// max_tokens (finish reason "length"); when tools are offered and the last
// message is the user's, it calls the first tool with arguments valid for
// its schema; after a tool result it answers with text quoting it; with a
// json_schema response format it replies with JSON valid for the schema.
// It serves POST /v1/chat/completions (streamed as server-sent events,
// with the final usage chunk when stream_options.include_usage is set,
// and [DONE]; or whole), POST /v1/embeddings (deterministic unit vectors)
// and GET /v1/models. It refuses what OpenAI refuses: an unknown model
// (404 model_not_found), a tool result that answers no earlier tool call,
// stream_options without stream, a missing or wrong API key when one is
// set (401, echoing the key it got, as OpenAI does).
//
// Every request is recorded (Requests), before any check, so a test can
// assert what was sent, or that nothing was. Replies can be scripted per
// request with faults: delays before the first byte, HTTP errors with
// headers such as Retry-After, bodies that are not JSON, streams cut
// cleanly or by closing the connection, error events mid-stream.
package openaitest
