package edge

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
// They do not let the edge place a plan's steps on other edges itself
// (Placer: watching the edges bucket, offering steps to other edges,
// following their mirrors and asking for their spans): an edge that
// does needs those too, which reach beyond its own names.
func Permissions(ns, name, cloudDomain string) (publish, subscribe []string) {
	if cloudDomain == "" {
		cloudDomain = DefaultDomain
	}
	api := "$JS." + cloudDomain + ".API."
	publish = []string{
		api + "$KV." + BucketName(ns) + "." + name,
		api + "STREAM.INFO.KV_" + BucketName(ns),
		api + "STREAM.*." + MirrorName(ns, name),
		"$JS.M.>",  // the mirror's messages from the outbox
		"$JSC.R.>", // answers to the mirror's requests to the outbox
		"_INBOX.>", // answers to the cloud's hand-offs
	}
	subscribe = []string{
		StepSubject(ns, name),
		SpansSubject(ns, name),           // the spans of its runs, asked by a step's origin
		CancelSubject(ns, name),          // cancels of its steps' runs, by their origins
		"$JS." + Domain(name) + ".API.>", // the mirror's requests to the outbox
		InboxPrefix(name) + ".>",         // answers to the edge's requests
		"$JS.FC.>",                       // the mirror's flow control
	}
	return publish, subscribe
}

// InboxPrefix is the inbox prefix of edge name's connection: the answers
// to its requests come there, and only there may it receive answers.
func InboxPrefix(name string) string { return "_INBOX_edge." + name }
