package cloud

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go/jetstream"
)

// WorkerInfo is what a worker says of itself in the namespace's workers
// bucket (NS_workers) every third of its lease TTL; the bucket forgets
// it one lease TTL after its last word, and a worker that closes deletes
// it at once. ReadWorkers adds the leases it holds.
type WorkerInfo struct {
	Name    string    `json:"name"`
	Started time.Time `json:"started"`
	// At is its last heartbeat.
	At time.Time `json:"at"`
	// Runs is how many work items it runs now, of MaxRuns.
	Runs    int `json:"runs"`
	MaxRuns int `json:"max_runs"`
	// Leases is how many runs' leases it holds (read from the leases
	// bucket, not said by the worker).
	Leases int `json:"-"`
}

// workersBucket is the namespace's workers bucket.
func workersBucket(ns string) string { return ns + "_workers" }

// workerKey is a worker's key in the workers bucket: a hash of its name,
// which may hold what a key may not.
func workerKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

// heartbeat puts the worker's WorkerInfo every third of the lease TTL
// until the worker stops; Close deletes it.
func (w *Worker) heartbeat(started time.Time) {
	defer w.wg.Done()
	t := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		info := WorkerInfo{Name: w.cfg.Name, Started: started, At: time.Now().UTC(), Runs: int(w.busy.Load()), MaxRuns: w.cfg.MaxRuns}
		if b, err := json.Marshal(info); err == nil {
			ctx, cancel := context.WithTimeout(w.ctx, w.cfg.LeaseTTL/3)
			if _, err := w.workers.Put(ctx, workerKey(w.cfg.Name), b); err != nil && w.ctx.Err() == nil {
				w.log.Warn("heartbeat", logkey.Err, err)
			}
			cancel()
		}
		select {
		case <-t.C:
		case <-w.ctx.Done():
			return
		}
	}
}

// ReadWorkers returns the workers of namespace ns that gave a heartbeat
// within the last lease TTL, by name, each with the leases it holds.
// No workers bucket yet (no worker started) is none.
func ReadWorkers(ctx context.Context, js jetstream.JetStream, ns string) ([]WorkerInfo, error) {
	if ns == "" {
		ns = "keel"
	}
	kv, err := js.KeyValue(ctx, workersBucket(ns))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	var out []WorkerInfo
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("workers: %w", err)
		}
		var wi WorkerInfo
		if json.Unmarshal(e.Value(), &wi) == nil {
			out = append(out, wi)
		}
	}
	held := map[string]int{}
	if leases, err := js.KeyValue(ctx, names(ns).leases); err == nil {
		lk, err := leases.ListKeys(ctx)
		if err != nil {
			return nil, fmt.Errorf("leases: %w", err)
		}
		for k := range lk.Keys() {
			if e, err := leases.Get(ctx, k); err == nil {
				held[string(e.Value())]++
			}
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("leases: %w", err)
	}
	for i := range out {
		out[i].Leases = held[out[i].Name]
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
