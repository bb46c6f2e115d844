package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go/jetstream"
)

// The cloud's names for edges, in namespace ns.

// BucketName is the key-value bucket of the edges' declarations (key: the
// edge's name; value: its route.Env as JSON).
func BucketName(ns string) string { return ns + "_edges" }

// MirrorName is the cloud stream mirroring edge's outbox: the edge's
// runs' events as its policy lets them cross.
func MirrorName(ns, edge string) string { return ns + "_EDGE_" + edge }

// HandoffStream is the stream of the cross-environment events of steps
// (subject NS.handoff.STEP).
func HandoffStream(ns string) string { return ns + "_HANDOFF" }

// StepSubject is where the cloud hands edge a step (request/reply).
func StepSubject(ns, edge string) string { return ns + ".edge." + edge + ".step" }

// CloudName is the key of the cloud's own declaration in the edges
// bucket; no edge may take the name.
const CloudName = "cloud"

// KindOf is the kind of the environment declared under name: the cloud's
// for CloudName, else an edge's, whatever the declaration says (an edge
// may not claim to be the cloud).
func KindOf(name string) string {
	if name == CloudName {
		return route.KindCloud
	}
	return route.KindEdge
}

// DefaultTTL is how long the cloud keeps an edge's declaration without a
// heartbeat.
const DefaultTTL = 15 * time.Second

// Setup creates, if need be, the cloud's edges bucket (entries expire
// after ttl, default DefaultTTL, leaving a delete marker a watch sees)
// and the hand-off stream, with replicas (default 3).
func Setup(ctx context.Context, js jetstream.JetStream, ns string, replicas int, ttl time.Duration) error {
	if replicas <= 0 {
		replicas = 3
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName(ns), History: 1, TTL: ttl,
		LimitMarkerTTL: ttl, Replicas: replicas, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("edges bucket: %w", err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: HandoffStream(ns), Subjects: []string{ns + ".handoff.>"},
		Replicas: replicas, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("hand-off stream: %w", err)
	}
	return nil
}

// ReadEdges returns the declarations in the edges bucket of ns, sorted by
// name: the edges connected now (an edge gone for longer than the
// bucket's TTL is not among them).
func ReadEdges(ctx context.Context, js jetstream.JetStream, ns string) ([]route.Env, error) {
	kv, err := js.KeyValue(ctx, BucketName(ns))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []route.Env
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // expired or deleted meanwhile
		}
		var d route.Env
		if json.Unmarshal(e.Value(), &d) == nil && d.Name == k {
			d.Kind = KindOf(k)
			out = append(out, d)
		}
	}
	return route.NewTable(out...).Envs(), nil
}

// Registry keeps a route.Table in step with the edges bucket: a
// declaration put is in the table, one deleted or expired is not.
// Extra environments (the cloud's own) are kept beside them.
type Registry struct {
	Table *route.Table

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at each change

	ready  chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Watch starts a Registry over the edges bucket of ns, holding extra too;
// it returns once the bucket's current entries are in the table. Close
// stops it.
func Watch(ctx context.Context, js jetstream.JetStream, ns string, log *slog.Logger, extra ...route.Env) (*Registry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kv, err := js.KeyValue(ctx, BucketName(ns))
	if err != nil {
		return nil, fmt.Errorf("edges bucket: %w", err)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, err
	}
	r := &Registry{Table: route.NewTable(extra...), ready: make(chan struct{}), cancel: cancel, changed: make(chan struct{})}
	r.wg.Go(func() {
		defer w.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the current entries are all in
					close(r.ready)
					continue
				}
				switch e.Operation() {
				case jetstream.KeyValuePut:
					var d route.Env
					if err := json.Unmarshal(e.Value(), &d); err != nil || d.Name != e.Key() {
						log.Warn("edges: a declaration that does not parse", logkey.Edge, e.Key(), logkey.Err, err)
						continue
					}
					d.Kind = KindOf(d.Name)
					r.Table.Put(d)
				default:
					r.Table.Remove(e.Key())
				}
				r.mu.Lock()
				close(r.changed)
				r.changed = make(chan struct{})
				r.mu.Unlock()
			}
		}
	})
	select {
	case <-r.ready:
		return r, nil
	case <-ctx.Done():
		r.Close()
		return nil, ctx.Err()
	}
}

// Wait waits until ok holds of the table, checked now and after each
// change, or ctx ends.
func (r *Registry) Wait(ctx context.Context, ok func(*route.Table) bool) error {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if ok(r.Table) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Close stops the watch.
func (r *Registry) Close() {
	r.cancel()
	r.wg.Wait()
}
