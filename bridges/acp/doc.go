// Package acp makes keel an Agent Client Protocol agent: the protocol
// editors (Zed, JetBrains and VS Code clients) use to drive coding
// agents, JSON-RPC 2.0 over newline-delimited stdio. `keel acp` serves
// it on its stdin and stdout, over a connection to the running daemon.
//
// It is an adapter over one small interface, Runs (run.start, run.fork,
// run.cancel, run.approve, run.get, run.list, run.subscribe): the daemon
// makes every decision, and the policy, approvals, labels and audit apply
// to an editor's session as to any run. What it translates:
//
//   - a session is a keel run: its first prompt starts a run (goal: the
//     prompt; workspace: the session's cwd), each later prompt forks the
//     session's last run from its last complete step with the prompt as
//     the fork's message (keel.ForkRequest.Message), so the model reads
//     the whole conversation; each run's idempotency key is
//     "acp:SESSION/TURN", which is how session/load finds the session's
//     last run after a restart (run.list, newest first); a run still
//     going then (resumed by the daemon, or waiting for an approval) is
//     followed until it ends, and a prompt sent meanwhile waits for it;
//   - the run's events become session/update notifications: model.delta
//     and model.result text as agent_message_chunk, each tool call as
//     tool_call (pending; its kind from the tool's side-effect class)
//     then tool_call_update (in_progress, completed
//     or failed, with its output or error), a plan run's plan.proposed
//     and step events as plan entries (a session's runs are agent runs,
//     which have none yet); session/load sends the last run's journal
//     so, the person's words as user_message_chunk;
//   - an approval.requested (a policy rule or --require-approval asks)
//     becomes session/request_permission with allow_once and reject_once;
//     the answer is run.approve with the call's args_sha256, so it
//     releases exactly the call shown;
//   - session/cancel is run.cancel, and the prompt answers cancelled; a
//     run that succeeded is end_turn (max_tokens when the answer's model
//     call finished for its token limit, refusal when its provider
//     refused), one that used every step without an answer
//     max_turn_requests, any other failure a JSON-RPC error with the
//     run's reason.
//
// The editor's mcpServers are accepted and ignored (logged): keel's tools
// are those installed and granted in keel. Malformed JSON (-32700), a
// message that is not JSON-RPC 2.0 (-32600), an unknown method (-32601),
// bad params (-32602) and a line over Config.MaxLineBytes (-32600, the
// line skipped) are answered and the agent goes on; the end of stdin ends
// it, the runs going on in the daemon.
package acp
