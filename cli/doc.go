// Package cli is the keel command line: every command except `keel daemon`
// is a client of the daemon over its WebSocket (ipc/client), found through
// DATA_DIR/daemon.json. Main is the whole program minus process setup, so
// it runs in tests with real arguments and writers.
package cli
