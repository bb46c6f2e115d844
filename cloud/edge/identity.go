package edge

import "github.com/nats-io/nats.go"

// Permissions returns what the cloud's leaf node port lets edge name of
// namespace ns do, as NATS user permissions of the leaf connection
// (from the edge's side): publish, the subjects it may send into the
// cloud; subscribe, those it may receive. With them, an edge's
// credentials write only its own key of the edges bucket, manage only
// its own mirror, and take only its own hand-offs: another edge's name
// is refused by the server, whatever the edge's code does.
//
// An edge publishes its declaration (a put of its key through the
// cloud's JetStream domain), asks for the bucket's and its mirror's
// stream, creates and updates its mirror, answers the cloud's requests
// (the hand-off of a step, the mirror's consumer on its outbox) and
// sends the mirror its outbox's messages. It receives its hand-offs and
// the requests for its runs' spans,
// the cloud's requests to its own JetStream domain, and the answers to
// its requests (its connection's inbox prefix is InboxPrefix), so that
// it cannot receive the answers others are sent. It may publish to any
// inbox (nats-server's allow_responses does not carry over a leaf
// link's permissions, which the hub turns around), but it sees none but
// its own to name.
//
// A step's origin asks the edge that runs it on the subjects with its
// own name after them (AskSubject): offers, cancels, spans. It may send
// there as itself only, and the edge that answers takes the origin from
// the subject, so an edge hands off, cancels and reads spans only as
// itself. It answers other edges' requests on their inbox prefixes.
//
// They do not yet let the edge's Placer watch the edges bucket or follow
// other edges' mirrors: a stream's name cannot be matched by part of a
// token (NS_EDGE_*), and letting an edge consume any stream of its
// account would let it pull from the workers' queue; an edge that places
// steps needs those rights granted another way.
func Permissions(ns, name, cloudDomain string) (publish, subscribe []string) {
	if cloudDomain == "" {
		cloudDomain = DefaultDomain
	}
	api := "$JS." + cloudDomain + ".API."
	publish = []string{
		api + "$KV." + BucketName(ns) + "." + name,
		api + "STREAM.INFO.KV_" + BucketName(ns),
		api + "STREAM.*." + MirrorName(ns, name),
		"$JS.M.>",               // the mirror's messages from the outbox
		"$JSC.R.>",              // answers to the mirror's requests to the outbox
		"_INBOX.>",              // answers to the cloud's hand-offs
		InboxPrefix("*") + ".>", // answers to other edges' hand-offs
		// A step's origin (Placer) offers it, cancels it and asks for
		// its spans as itself (AskSubject).
		AskSubject(StepSubject(ns, "*"), name),
		AskSubject(CancelSubject(ns, "*"), name),
		AskSubject(SpansSubject(ns, "*"), name),
	}
	subscribe = []string{
		StepSubject(ns, name),
		SpansSubject(ns, name),           // the spans of its runs, asked by a step's origin
		CancelSubject(ns, name),          // cancels of its steps' runs, by their origins
		StepSubject(ns, name) + ".*",     // the same, asked by edges, each as itself
		SpansSubject(ns, name) + ".*",    //
		CancelSubject(ns, name) + ".*",   //
		"$JS." + Domain(name) + ".API.>", // the mirror's requests to the outbox
		InboxPrefix(name) + ".>",         // answers to the edge's requests
		"$JS.FC.>",                       // the mirror's flow control
	}
	return publish, subscribe
}

// InboxPrefix is the inbox prefix of edge name's connection: the answers
// to its requests come there, and only there may it receive answers.
func InboxPrefix(name string) string { return "_INBOX_edge." + name }

// AskSubject is subject (StepSubject, CancelSubject, SpansSubject of an
// edge) as edge asker sends to it: its name after it. An edge's
// credentials let it send there under its own name only (Permissions),
// so the edge that answers knows who asks; "" leaves subject as it is
// (the cloud's requests, whose connection is not an edge's).
func AskSubject(subject, asker string) string {
	if asker == "" {
		return subject
	}
	return subject + "." + asker
}

// askerOf returns the name of the edge that sent m to subject (the
// token after it), and whether one did.
func askerOf(m *nats.Msg, subject string) (string, bool) {
	if len(m.Subject) > len(subject)+1 && m.Subject[:len(subject)+1] == subject+"." {
		return m.Subject[len(subject)+1:], true
	}
	return "", false
}
