// Package policy is keel's one decision point: before an action happens
// (a tool call, a model call, a tool's network egress, a knowledge read,
// a telemetry export) it answers allow, ask or deny, and says why: the
// rule that decided, its layer, and the file and line it came from.
//
// The package is pure: files in, decisions out. Its only I/O is reading
// the layer files (Load) and watching them for changes (Watcher). It
// imports the root package for the side-effect classes and nothing else
// of keel, so whoever wires it in (the daemon, behind the interception
// seams of package intercept) decides what a decision does.
//
// # Layers
//
// Rules come from four layers, in precedence order: managed (a
// system-wide file an administrator owns, DefaultManagedPath), workspace
// (.keel/policy.json in the workspace a run names), user (policy.json in
// the data directory) and run (rules passed when a run starts, and the
// --require-approval shorthand). All four share one JSON format (see
// docs/policy.md). The strictest verdict wins, deny over ask over allow,
// so a deny anywhere wins and a lower layer can tighten but never loosen
// what a higher one set. The managed layer can lock a setting; a lower
// layer that sets a locked setting to another value is refused.
//
// A Watcher keeps the managed and user files in force and, for each
// workspace a live run names (Watcher.Use), that workspace's file with
// them: one fsnotify watcher and one goroutine for all of them, a
// workspace watched only while a run uses it.
//
// # Labels
//
// Data carries labels (private, secret, pii or names of one's own) from
// where it came: a filesystem grant, a workspace path, a knowledge scope,
// a human message, a tool's declared output, a run's inputs. LabelSet is
// the arithmetic (labels only join as data flows); Context is a run's
// labelled context with its explicit declassifications. A model call to a
// cloud provider is denied while the context holds a label not cleared
// for that provider, and a tool's egress after labelled data entered the
// context asks by default.
//
// # Matching
//
// Paths and URLs are normalized before they are matched, on both the
// pattern and the argument side: a path is NFC-normalized, has ~
// expanded, is cleaned of .. and trailing slashes, and may be resolved
// through a caller's resolver (the sandbox's view of symlinks); a URL
// loses its userinfo, gets its default port, and its host is lower-cased,
// converted from IDN to its ASCII form, and read as an IP address in any
// of the forms a resolver accepts (0x7f.1, 2130706433, 0177.0.0.1,
// ::ffff:127.0.0.1). An argument that cannot be normalized matches every
// rule that restricts (ask or deny) and no rule that allows.
//
// # Concurrency and cost
//
// A *Policy is immutable and safe for concurrent use. Rules are indexed
// by action kind and tool (or provider, or scope) name, so a decision
// looks only at the rules that can apply, and the allow path does not
// allocate: a Decision is a small value whose explanation is formatted
// only when asked for.
package policy
