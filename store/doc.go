// Package store is keel's persistence: one SQLite file (modernc.org/sqlite,
// no cgo) in WAL mode holding runs, their append-only event journal and
// their trace spans. Migrations are embedded and applied on Open.
//
// Durability: every write is one transaction committed with
// synchronous=FULL, so an event the store has returned survives a crash
// of the process or the machine. Writes go through a single connection
// (SQLite allows one writer at a time; queueing in Go avoids SQLITE_BUSY
// storms); reads use a separate pool and see committed data only.
//
// Driver errors are mapped to keel.ErrNotFound and keel.ErrConflict;
// a full disk is reported as ErrDiskFull. A Store is safe for concurrent use.
package store
