// Package daemon is keel's composition root, and nothing else. New reads
// the configuration once, checks it and takes the data directory (lock,
// token) before any slow work; the caller binds the listener; Serve
// builds the layers in order (store, models, tools, engine, ipc), hands
// each the small interfaces the next one consumes, writes the daemon.json
// discovery file, runs their lifetimes in one errgroup and stops them in
// reverse order. Only cmd/keel and end-to-end tests import it.
package daemon
