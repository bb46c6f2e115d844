// Package daemon is keel's composition root. It reads the configuration
// once, checks the flags and binds the listener before any slow work,
// then builds the layers in order (store, models, tools, engine, ipc), owns the data directory (database, tools, token, lock and the
// daemon.json discovery file) and stops everything in reverse order.
// Only cmd/keel and end-to-end tests import it.
package daemon
