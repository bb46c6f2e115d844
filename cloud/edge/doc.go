// Package edge joins a keel daemon to a cloud as a leaf node, and holds
// the cloud's side of edges.
//
// On the edge (Join), the daemon runs an embedded nats-server whose one
// remote is the cloud's leaf node port: the daemon's own connection is
// in-process to that server, so it works whether the link is up or not,
// and the server reconnects by itself. Over the link the edge publishes
// its declaration (Declare: the tools, models, grants' labels its
// env.describe shows) into the cloud's edges bucket every heartbeat (a
// key-value bucket whose entries expire, so an edge that leaves without
// a word disappears), and answers the steps the cloud hands it. Its
// runs' events go through a policy filter (Filter: labels decide; an
// event whose labels the cloud may not hold crosses as a withheld stub,
// and so does everything after it in the same run) into an outbox, a
// JetStream stream on the leaf server's own domain, which the cloud
// mirrors: when the link is down the outbox fills, when it returns the
// mirror catches up, in order, exactly once.
//
// On the cloud (Setup, Watch, ReadEdges, Handoff): the edges bucket, the
// hand-off ledger stream, a Registry that keeps a route.Table of the
// declarations in step with the bucket, and the hand-off of a step to
// the edge a route.Decision names.
//
// Between edges (Placer, place.go): a joined daemon's engine hands the
// plan steps it cannot run to the edge that declares their tools, by the
// same offer, follows the run in that edge's mirror, and asks that edge
// for the run's spans, which it gives as the run's journal crossed
// (whole, or one stub).
//
// An Edge's goroutines are started by Join and stopped by Close; a
// Registry's by Watch and Close. docs/cloud.md ("Edges") has the design.
package edge
