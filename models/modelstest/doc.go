// Package modelstest owns the conformance suite of the model layer, in the
// style of testing/fstest: TestProvider checks that a models.Provider keeps
// the contract documented on the interface (listing, streaming, usage,
// cancellation, structured output, tool calls, errors, concurrency). Every
// provider's tests run it: the real ones against a real backend, the
// scripted fake against a script.
package modelstest
