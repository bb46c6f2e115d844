// Package jsstore is the engine's store seam (engine.Store: a Journal and
// a Tracer) on NATS JetStream, the second implementation beside the
// SQLite store: what lets several workers of the engine share runs, each
// resuming another's from its journal (see docs/cloud.md).
//
// Layout, per namespace NS (Config.Namespace; tests give each theirs):
//
//   - stream NS_JOURNAL, subject NS.journal.RUN per run: one message per
//     append, holding the append's events (numbered), the status change
//     it makes, and for the first the run itself. An append is published
//     with the run subject's last sequence as its expected last sequence
//     (Nats-Expected-Last-Subject-Sequence), so it is stored only if
//     nothing else was appended since the appender last read the run:
//     two writers of one run (a worker presumed dead and the one that
//     took its run over) cannot both append; the loser gets
//     keel.ErrConflict. A message is all of an append or none of it.
//   - key-value bucket NS_runs: each run's head (the run and the journal
//     sequence it reflects), written after each status change, read to
//     list runs by status. The journal is the truth: a head a crash left
//     behind is repaired from it when read.
//   - key-value bucket NS_idem: idempotency key (its SHA-256) to run ID.
//   - stream NS_SPANS, subject NS.spans.RUN: trace spans, buffered and
//     published in batches (one message per run, the last version of a
//     span winning) with the Store's next journal append, by Sync, or
//     50 ms after the first one buffered. A span that is the only record
//     of something (a failed model call's spending, a person's answer)
//     is stored before the append it goes with, as engine.Tracer asks;
//     the others go beside it, unwaited. A step is then two messages,
//     one waited for.
//
// Durability: streams and buckets have Config.Replicas replicas (default
// 3); a write returns once a quorum of them has it. With the servers'
// sync_interval at its default, that is in the memory of two nodes and
// on their disks within two minutes; with sync_interval: always, on two
// nodes' disks. docs/cloud.md compares this with the SQLite store's
// synchronous=FULL.
//
// A Store caches the runs it has read or written and checks the cache
// against the journal's last message for the run on every read (one
// request), so a run another Store appended to reads as it is.
package jsstore
