// Package cloud runs keel's engine as a fleet: N workers over one NATS
// JetStream cluster, sharing runs. The journal, run heads and spans are
// in JetStream (cloud/jsstore, the engine's store seam); work is a
// work-queue stream that workers pull from; a worker holds a lease (a
// key-value entry with a time to live, renewed by compare-and-set) on
// each run it runs, and when it dies its lease lapses, its work items are
// delivered again, and another worker adopts the run from its journal
// (engine.Adopt) under the engine's exactly-once rules. The journal's
// append guard fences a worker presumed dead that is in fact still
// appending. docs/cloud.md has the design, the durability given and what
// is not built yet.
//
// A Worker's goroutines are started by Start and stopped by Close (or
// Kill, which a test uses to make a worker die).
package cloud
