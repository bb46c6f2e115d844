package edge_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEdgeIdentity: each edge has credentials of its own on the cloud's
// leaf port, with permissions on its own key, mirror and subjects
// (edge.Permissions). Edge a, joined with a's credentials, declares
// itself and its journal reaches its mirror; through a's leaf link, a
// declaration under b's name is refused by the server (the bucket never
// holds it, though a's own put that followed it on the same link is
// stored), and a subscription to b's hand-offs receives nothing (a
// request to b's step subject finds no responder), while a's own does.
// Edge c's user is in tenant acme's account: its link binds there, and
// its declaration and mirror are acme's, not the default account's.
func TestEdgeIdentity(t *testing.T) {
	t.Parallel()
	users := []natstest.LeafUser{}
	for _, n := range []string{"id-a", "id-b", "id-c", "id-q"} {
		pub, sub := edge.Permissions(ns, n, "")
		users = append(users, natstest.LeafUser{User: n, Password: n + "-secret-0123", Publish: pub, Subscribe: sub})
	}
	acme := natstest.Account{Name: "acme", Token: "acme-0123456789abcdef"}
	users[2].Account = acme.Name // id-c is an edge of tenant acme
	cl, err := natstest.Start(natstest.Options{Nodes: 1, Domain: edge.DefaultDomain, LeafNodes: true, LeafUsers: users,
		Accounts: []natstest.Account{acme}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hub, err := cl.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	hjs, _ := jetstream.New(hub)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := edge.Setup(ctx, hjs, ns, 1, ttl); err != nil {
		t.Fatal(err)
	}
	credsOf := func(name string) string {
		creds := filepath.Join(t.TempDir(), name+".creds")
		if err := os.WriteFile(creds, []byte(name+":"+name+"-secret-0123\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return creds
	}
	join := func(name string, j *journal, with ...func(*edge.Sources)) *edge.Edge {
		creds := credsOf(name)
		src := edge.Sources{Describe: func(context.Context) (capabilities.Environment, error) { return capabilities.Environment{}, nil },
			Labels: func(context.Context, keel.RunID) ([]string, error) { return nil, nil }, Journal: j}
		for _, f := range with {
			f(&src)
		}
		e, err := edge.Join(ctx, edge.Config{URL: cl.LeafURLs(), Credentials: creds, Name: name, Dir: t.TempDir(), Heartbeat: 100 * time.Millisecond}, src)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			e.Close(cctx)
		})
		return e
	}
	j := &journal{}
	const run = keel.RunID("run_identity")
	e := join("id-a", j)
	for _, ev := range j.add(run, keel.EventRunStarted, keel.EventRunSucceeded) {
		e.OnEvent(ev)
	}
	kv, err := hjs.KeyValue(ctx, edge.BucketName(ns))
	if err != nil {
		t.Fatal(err)
	}
	// a's declaration, then its journal in its mirror.
	w, err := kv.Watch(ctx, "id-a")
	if err != nil {
		t.Fatal(err)
	}
	for declared := false; !declared; {
		select {
		case en := <-w.Updates():
			declared = en != nil && en.Operation() == jetstream.KeyValuePut
		case <-ctx.Done():
			t.Fatal("edge id-a did not declare itself within a minute")
		}
	}
	w.Stop()
	if err := edge.Follow(ctx, hjs, ns, "id-a", run, func(ev keel.Event) bool { return ev.Type != keel.EventRunSucceeded }); err != nil {
		t.Fatalf("id-a's run in its mirror: %v", err)
	}

	// Through a's link: b's key, then a's own.
	nc := edge.Conn(e)
	ejs, err := jetstream.NewWithDomain(nc, edge.DefaultDomain)
	if err != nil {
		t.Fatal(err)
	}
	ekv, err := ejs.KeyValue(ctx, edge.BucketName(ns))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	_, errB := ekv.Put(pctx, "id-b", []byte(`{"name":"id-b","kind":"edge"}`))
	pcancel()
	if _, err := ekv.Put(ctx, "id-a", []byte(`{"name":"id-a","kind":"edge"}`)); err != nil {
		t.Fatalf("id-a puts its own key: %v", err)
	}
	if _, err := kv.Get(ctx, "id-b"); errB == nil || !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("id-a's link put id-b's declaration: put %v, then the bucket's id-b: %v; want the put refused and no id-b", errB, err)
	}

	// Hand-offs: b's subject, then a's own, subscribed through a's
	// link. Interest crosses the link in order: once a request to a's is
	// answered, b's subscription has reached the cloud, or been refused.
	for _, n := range []string{"id-b", "id-a"} {
		if _, err := nc.Subscribe(edge.StepSubject(ns, n), func(m *nats.Msg) { m.Respond([]byte("here")) }); err != nil {
			t.Fatal(err)
		}
	}
	for {
		_, err := hub.Request(edge.StepSubject(ns, "id-a"), []byte("probe"), 2*time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) || ctx.Err() != nil {
			t.Fatalf("a request to id-a's hand-offs, subscribed through its link: %v", err)
		}
		select { // the interest is on its way
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if _, err := hub.Request(edge.StepSubject(ns, "id-b"), []byte("probe"), 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("a request to id-b's hand-offs, subscribed through id-a's link: %v, want no responders", err)
	}

	// An edge of tenant acme: its link binds to acme's account, so its
	// declaration and its journal are acme's, and the default account's
	// bucket never holds it.
	anc, err := cl.ConnectAs(acme)
	if err != nil {
		t.Fatal(err)
	}
	defer anc.Close()
	ajs, _ := jetstream.New(anc)
	if err := edge.Setup(ctx, ajs, ns, 1, ttl); err != nil {
		t.Fatal(err)
	}
	jc := &journal{}
	ec := join("id-c", jc)
	for _, ev := range jc.add("run_acme", keel.EventRunStarted, keel.EventRunSucceeded) {
		ec.OnEvent(ev)
	}
	if err := edge.Follow(ctx, ajs, ns, "id-c", "run_acme", func(ev keel.Event) bool { return ev.Type != keel.EventRunSucceeded }); err != nil {
		t.Fatalf("id-c's run in its mirror in acme's account: %v", err)
	}
	akv, err := ajs.KeyValue(ctx, edge.BucketName(ns))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := akv.Get(ctx, "id-c"); err != nil {
		t.Errorf("acme's edges bucket: id-c: %v, want its declaration", err)
	}
	if _, err := kv.Get(ctx, "id-c"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the default account's edges bucket: id-c: %v, want not found", err)
	}

	// Hand-offs between edges under per-edge credentials: an edge asks
	// on the subjects with its own name after them (AskSubject), and the
	// edge that answers takes the origin from there, not from what the
	// request says. Through id-a's link, a step offered as id-a but
	// saying id-p is id-a's; one offered in id-p's name, and a cancel in
	// it, are refused by the server (no answer).
	offers := &memOffers{}
	join("id-q", &journal{}, func(src *edge.Sources) {
		src.Offers = offers
		src.Start = func(_ context.Context, req keel.StartRequest) (keel.Run, error) {
			return keel.Run{ID: keel.RunID("run_" + req.IdempotencyKey), Status: keel.RunRunning}, nil
		}
		src.Cancel = func(_ context.Context, id keel.RunID) (keel.Run, error) {
			return keel.Run{ID: id, Status: keel.RunCancelled}, nil
		}
	})
	var acc edge.Accepted
	for acc, err = edge.Offer(ctx, nc, ns, "id-q", edge.Step{ID: "mine", Goal: "g", Need: route.Need{Origin: "id-a"}}); errors.Is(err, nats.ErrNoResponders); {
		select { // id-q's subscriptions are on their way
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		acc, err = edge.Offer(ctx, nc, ns, "id-q", edge.Step{ID: "mine", Goal: "g", Need: route.Need{Origin: "id-a"}})
	}
	if err != nil {
		t.Fatalf("id-a offers a step to id-q as itself: %v", err)
	}
	b, _ := json.Marshal(edge.Step{ID: "claims-p", Goal: "g", Need: route.Need{Origin: "id-p"}})
	if _, err := nc.Request(edge.AskSubject(edge.StepSubject(ns, "id-q"), "id-a"), b, 10*time.Second); err != nil {
		t.Fatalf("id-a offers a step saying id-p on its own subject: %v", err)
	}
	if o := offers.origin("step-claims-p"); o != "id-a" {
		t.Errorf("the origin id-q keeps for a step id-a offered saying id-p = %q, want id-a", o)
	}
	octx, ocancel := context.WithTimeout(ctx, time.Second)
	if a, err := edge.Offer(octx, nc, ns, "id-q", edge.Step{ID: "spoofed", Goal: "g", Need: route.Need{Origin: "id-p"}}); err == nil {
		t.Errorf("an offer in id-p's name through id-a's link = %+v, want no answer", a)
	}
	if st, err := edge.RemoteCancel(octx, nc, ns, "id-q", edge.CancelRequest{Run: acc.RunID, Origin: "id-p"}); err == nil {
		t.Errorf("a cancel in id-p's name through id-a's link = %s, want no answer", st)
	}
	ocancel()
	if o := offers.origin("step-spoofed"); o != "" {
		t.Errorf("id-q kept an offer in id-p's name from id-a's link (origin %q)", o)
	}
	// id-a's own cancel of its step is answered.
	if st, err := edge.RemoteCancel(ctx, nc, ns, "id-q", edge.CancelRequest{Run: acc.RunID, Origin: "id-a"}); err != nil || st != keel.RunCancelled {
		t.Errorf("id-a cancels its step on id-q = %s, %v; want cancelled", st, err)
	}
}

// memOffers keeps the offers of an edge of the tests in memory.
type memOffers struct {
	mu     sync.Mutex
	offers map[string]keel.StepOffer
}

func (m *memOffers) OfferStep(_ context.Context, o keel.StepOffer) (keel.StepOffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.offers == nil {
		m.offers = map[string]keel.StepOffer{}
	}
	if got, ok := m.offers[o.Key]; ok {
		return got, nil
	}
	o.Run = keel.RunID("run_" + o.Key) // as the tests' Start names it
	m.offers[o.Key] = o
	return o, nil
}

func (m *memOffers) CancelStepOffer(_ context.Context, key, origin string) (keel.StepOffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.offers[key]
	if !ok {
		o = keel.StepOffer{Key: key, Origin: origin}
	}
	if o.Origin == origin {
		o.Cancelled = true
	}
	m.offers[key] = o
	return o, nil
}

func (m *memOffers) StepOfferOf(_ context.Context, run keel.RunID) (keel.StepOffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.offers {
		if o.Run == run {
			return o, nil
		}
	}
	return keel.StepOffer{}, keel.ErrNotFound
}

func (m *memOffers) origin(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.offers[key].Origin
}
