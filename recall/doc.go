// Package recall puts the knowledge store (package knowledge) to use:
// the built-in knowledge_search tool runs call, the decision of which
// scopes a run may read, the fsnotify watch that keeps indexed
// directories fresh, and the service behind the knowledge.* protocol
// methods. The daemon wires it; docs/knowledge.md is the user's guide.
//
// # Who reads what
//
// A knowledge scope is read only where the policy says so (action
// knowledge, docs/policy.md): with nothing said, a run may read its own
// scopes, its workspace's ("workspace:ROOT") and its own ("run:ID"), and
// no other; "user" and other workspaces need a rule that allows them.
// knowledge_search is offered only to runs that may read a scope that
// holds something (engine.Offerer), and each call decides again, with
// the policy in force then.
//
// # Labels
//
// A hit carries its scope's labels (set when the scope is made, or with
// knowledge.labels) and those the policy's sources give the scope and,
// for a file, its path. The tool gives them to the engine as the labels
// of its output (keel.Touched), so text from a private scope makes the
// run's context private: from then on no model call of the run goes to
// a cloud provider, and a tool's egress asks first.
//
// # The tool
//
// knowledge_search is read-only and idempotent. Its calls go through the
// same interceptors as any tool's (the audit trail), each records a
// retrieval span (keel.SpanRetrieval) under the call's span with the
// query, the scopes searched and every hit with its scores, and its
// output cites each hit as [n] source:lines, one hit a line, best first,
// within Config.MaxOutputBytes, so that the model's answer can refer to
// them and a cut to fit the model's context (engine) drops whole hits.
//
// # Watch
//
// A Watcher keeps directories indexed: one fsnotify watcher over each
// directory and its subdirectories (new ones included), whose events
// (create, write, rename, remove) are batched for Config.Debounce and
// applied as adds and forgets; a batch that is one rename (one path gone,
// one new) moves the documents instead (knowledge.Index.Rename), so
// nothing is chunked or embedded again. The directories watched are kept in a
// file in the data directory, so a restarted daemon watches them again
// and catches up with what changed meanwhile (an add of an unchanged
// file costs a hash).
package recall
