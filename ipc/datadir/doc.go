// Package datadir owns the layout of keel's data directory as far as the
// daemon and its clients meet in it: where it is by default, the lock
// that lets one daemon at a time serve it, the client token, and the
// discovery file daemon.json that tells a client where the daemon
// listens and which token file to read. The daemon writes them
// (Lock, EnsureToken, WriteInfo, RemoveInfo); a client reads them
// (ReadInfo, ReadToken). What else the directory holds (the database,
// tools, models.json) belongs to the layer that uses it.
package datadir
