// Package keel is the shared vocabulary of the keel agent runtime: runs,
// their events and trace spans, tool descriptions and classified tool
// errors. It holds types only and does no I/O; every other package may
// import it.
package keel
