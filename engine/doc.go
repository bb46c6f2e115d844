// Package engine runs agent runs. It owns the lifecycle of a run (queued,
// running, then succeeded, failed or cancelled; interrupted when the daemon
// stops under it), the order of its steps, and its journal: every model
// result and tool result is appended to the store before it is used or
// sent to any client.
//
// The agent loop: the engine sends the goal and the tool list to the
// model; when the model asks for tools, the engine records the intent,
// runs the tool (which validates its arguments against its schema),
// records the result and feeds it back, until the model answers or the
// step limit is reached. Every model and tool call is a trace span, in a
// tree per run (trace.go): run → step → calls, waits and retries.
//
// Before each tool call the engine asks the policy (decision.go,
// Config.Policy, with Config.RequireApproval and the run's own rules,
// keel.RunPolicy.Rules, as run-layer rules): allow
// runs it, ask waits for a person's approval (approve.go), deny fails
// it as a policy_denied tool error without running it. An ask or deny
// is journaled with the call, so a resume and a replay use it instead of
// deciding again; an allow is journaled with the first call under each
// policy (journaledDecision) and is on every call's span. A model call carries the policy's check of each
// target to the model layer (models.ChatRequest.Admit), and the
// decisions a rule made are journaled with its model.result. The policy
// is the one of the run's workspace (Policy.CurrentFor), whose layer the
// engine keeps in use (Policy.Use) while the run lives; a change of the
// policy in force is journaled in the run (policy.changed) before the
// first decision it makes.
//
// Labels follow data through a run (labels.go): the run's inputs, tool
// results, a person's messages and a sub-agent's result bring their
// labels into the run's context, journaled with them; a declassification
// takes one out. The labels a context holds are one fold over the
// journal, which resume and replay use and which a live run applies event
// by event as it journals them. Every model request carries them
// (admitModel refuses a cloud target for a label not cleared for it), as
// do model results and summaries; a network-capable tool's call after
// labelled data entered the context is also decided as egress, and each
// of its requests is checked (ToolInvocation.Egress).
//
// Plan and DAG runs (flow.go, docs/orchestration.md) run a plan's steps
// as sub-agents: agent runs of their own, linked to the parent, with
// their own budget and tool subset, at most Config.MaxParallelSteps at
// once; a plan run's model proposes the plan and re-plans when a step
// fails. The parent's state is its journal, so it resumes like any run.
// Its files: flow.go (the parent's goroutine), flowstate.go (its state,
// rebuilt from the journal), plan.go (validation and schema), planner.go
// (the planner's model step), budget.go (what each sub-agent may spend)
// and place.go (a step whose tool this environment lacks handed to
// another through Config.Placer, and waited for durably).
//
// The engine consumes small interfaces defined here (a Journal and a
// Tracer, together its Store; Model; Tools) and takes its clock, its
// sleeper and its ID source from Config so runs are reproducible. A
// replay (replay.go) is the same loop run against recorded ones: the
// journal's model and tool results and context summaries, a sleeper that
// does not wait, and a journal in memory.
// Each run has one goroutine, started by Start and joined by Close.
package engine
