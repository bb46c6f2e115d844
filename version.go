package keel

// Version is keel's release version, the same for the daemon and the
// CLI; `keel version` adds the commit it was built from.
const Version = "0.1.0-dev"
