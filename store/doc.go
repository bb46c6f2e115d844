// Package store is keel's persistence: one SQLite file (modernc.org/sqlite,
// no cgo) in WAL mode holding runs, their append-only event journal and
// their trace spans. Migrations are embedded and applied on Open.
//
// Durability: journal_mode=WAL with synchronous=FULL, so a write the store
// has returned is in the WAL and fsync'd: it survives a crash of the
// process and of the machine. (NORMAL, available through OpenWith for
// benchmarks, syncs only at checkpoints: a crash of the process loses
// nothing, a power cut may lose the last commits. keel's promise that a
// journaled tool result is never requested again rests on FULL.)
//
// Group commit: all writes go through one writer connection, one commit
// at a time (SQLite allows one writer at a time; queueing in Go avoids
// SQLITE_BUSY storms). A write that finds the writer idle is committed by
// its caller's goroutine; writes that arrive during a commit are
// committed together by the writer's goroutine once it ends, so that
// concurrent runs share an fsync while a lone run pays no goroutine
// switch. One failing write undoes only itself (journal appends and span
// writes are atomic alone, other writes run in a savepoint). The writer
// keeps running runs' heads (last sequence number, status) in memory and
// drops them when anything fails, so an append reads nothing; AppendAll
// journals several events of a run in one transaction. Trace spans are
// written lazily: they commit with the next write that makes a run wait
// for a person, right after the next other write that changes a run's
// status (which does not wait for them), with Sync, or on their own
// after a short delay, and Spans reads those still waiting too; a span
// that is the only record of something (a failed model call's, a
// person's wait) commits with the next write of any kind; a span finished
// before its start was committed is written once. The audit trail is a
// tool interceptor (AuditTrail): a direct call's record is on disk when
// the call returns, a run's call's commits with the next write of any
// kind, at the latest the run's journal of the call's result. The one
// exception to synchronous=FULL: a direct call of a tool that declares
// itself read-only, and reached no host, has its record committed (in
// the WAL: it survives a crash of the process) but not synced, in a
// transaction run at synchronous=NORMAL; the next synced commit takes it
// to the disk (see AuditTrail, UnsyncedCommits). Reads use a
// separate pool and see committed data only.
//
// Driver errors are mapped to keel.ErrNotFound and keel.ErrConflict;
// a full disk is reported as ErrDiskFull. A Store is safe for concurrent use.
package store
