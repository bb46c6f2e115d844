package keel

// The requests below are shared by the protocol (ipc/protocol aliases
// them as its params and results) and the packages that serve them (the
// engine, the store), so a request travels from the wire to its server
// without being copied field by field.

// StartRequest asks for a new run (the params of run.start).
type StartRequest struct {
	// Goal is what the run is to achieve; it must not be empty.
	Goal string `json:"goal"`
	// Model names the model; empty means the daemon's default.
	Model string `json:"model,omitempty"`
	// MaxSteps bounds model calls; 0 means the daemon's default (8).
	MaxSteps int `json:"max_steps,omitempty"`
	// Policy: cloud models allowed (where the daemon allows cloud),
	// private content, token and dollar budgets. Default: local only.
	Policy RunPolicy `json:"policy,omitzero"`
	// IdempotencyKey, when set, makes a retried start safe: a start with
	// a key already used returns that run instead of a new one.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Kind is how the run is driven: "agent" (the default, KindAgent),
	// "plan" (the model plans, the runtime runs the steps) or "dag" (the
	// steps of Plan); see docs/orchestration.md.
	Kind RunKind `json:"kind,omitempty"`
	// Plan is the steps of a "dag" run, checked at start (unique step
	// IDs, known dependencies, no cycle, tools that exist and the policy
	// allows, bounded sizes); refused for other kinds.
	Plan *Plan `json:"plan,omitempty"`
	// Workspace is the directory the run works in, an absolute path:
	// its .keel/policy.json is the run's workspace policy layer. Empty:
	// no workspace layer.
	Workspace string `json:"workspace,omitempty"`
}

// ForkRequest asks for a new run from another's journal (the params of
// run.fork).
type ForkRequest struct {
	// RunID is the run forked from.
	RunID RunID `json:"run_id"`
	// Step is the last step of the source the fork keeps, with its tool
	// results; 0 keeps only the goal.
	Step int `json:"step"`
	// Model and Goal, when set, replace the source's.
	Model string `json:"model,omitempty"`
	Goal  string `json:"goal,omitempty"`
	// Message, when set, is a person's message journaled in the fork
	// after the copied steps (human.message, with the labels the policy
	// gives human messages): the fork's next model step reads it. A fork
	// of a run that answered goes on with this message instead of ending
	// with the same answer: the next turn of a conversation.
	Message string `json:"message,omitempty"`
	// MaxSteps, when not 0, bounds the fork's model steps, copied ones
	// included; it must be greater than Step. 0 keeps the source's.
	MaxSteps int `json:"max_steps,omitempty"`
	// IdempotencyKey (at most 200 bytes) makes a retried fork safe: a
	// fork with a key already used returns the run that key created,
	// when that run was forked from the same run (else ErrConflict).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// RunQuery selects a page of runs, newest first (the params of
// run.list).
type RunQuery struct {
	// Limit is the most runs returned; 0 means 50. The protocol accepts
	// at most 1000.
	Limit int `json:"limit,omitempty"`
	// Status, when not empty, keeps only runs in one of these states.
	Status []RunStatus `json:"status,omitempty"`
	// Cursor continues a listing: the NextCursor of the page before. A
	// cursor that no page returned is invalid (ErrInvalid).
	Cursor string `json:"cursor,omitempty"`
}

// RunPage is one page of runs (the result of run.list).
type RunPage struct {
	Runs []Run `json:"runs"`
	// NextCursor, when not empty, lists the next page (as Cursor).
	NextCursor string `json:"next_cursor,omitempty"`
}

// ReplayCheck is a run replayed from its journal (the result of
// run.replay): the events the engine produced from the journaled results,
// and whether they match the journal (times, durations and
// lifecycle-only events aside), else the first difference.
type ReplayCheck struct {
	Events     []Event `json:"events"`
	Matches    bool    `json:"matches"`
	Difference string  `json:"difference,omitempty"`
}
