// Package scripted owns a deterministic fake models.Provider for tests of
// the engine and end-to-end tests: each model call is answered by the next
// Step of a script written by the test, with streamed deltas, token counts
// computed from word counts, and a record of every request received.
//
// A single script is shared by all calls (New), or each conversation gets
// its own script keyed on its goal, the content of its first user message
// (ByGoal), so many concurrent runs can each follow their own steps.
//
// It does no I/O and starts no goroutines. It passes the conformance suite
// in models/modelstest like every real provider.
package scripted
