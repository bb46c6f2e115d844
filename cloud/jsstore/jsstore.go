package jsstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a Store. The zero value is usable.
type Config struct {
	// Namespace names the streams, subjects and buckets (see the package
	// documentation): letters, digits, '-' and '_'; default "keel".
	// Stores with different namespaces share nothing.
	Namespace string
	// Replicas is the replication factor of the streams and buckets
	// Open creates: 1 (one node's copy) or 3 (quorum of 3); default 3.
	// Streams that exist are used as they are.
	Replicas int
	// OnLazyError receives the errors of span writes that no caller
	// waits for (published after lazyDelay); nil drops them. Sync and
	// the next journal append return them too.
	OnLazyError func(error)
}

// Store is the engine's store (engine.Store) on JetStream. It is safe
// for concurrent use; several Stores, in one process or many, may share
// a namespace (see the package documentation for who wins a conflict).
type Store struct {
	js      jetstream.JetStream
	ns      string
	journal jetstream.Stream
	spans   jetstream.Stream
	heads   jetstream.KeyValue
	idem    jetstream.KeyValue

	id   string        // this Store's own ID, in its appends' message IDs
	seq  atomic.Uint64 // its appends so far
	mu   sync.Mutex
	runs map[keel.RunID]*runState

	onLazyError func(error)

	spanMu   sync.Mutex
	buffered []keel.Span   // span writes not yet published (see spans.go)
	alone    bool          // one of them records something alone
	lazy     *time.Timer   // publishes buffered ones after lazyDelay
	closed   bool          // Close was called: no more timers
	pending  []*spanWrite  // span batches published, maybe not yet acknowledged
	quit     chan struct{} // closed by Close: stops waiting for acks
}

// runState is what the Store knows of one run: its journal as of stream
// sequence through. mu serializes the appends of this Store to the run.
type runState struct {
	mu      sync.Mutex
	loaded  bool
	lost    bool // an append lost to another writer's: none until the run is read
	run     keel.Run
	through uint64
	evs     []keel.Event
}

// ErrNamespace is returned by Open for a namespace that cannot name
// streams.
var ErrNamespace = errors.New("jsstore: namespace must be letters, digits, '-' or '_'")

// Open returns a Store over js, creating its streams and buckets if they
// do not exist.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "keel"
	}
	if strings.Trim(cfg.Namespace, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
		return nil, fmt.Errorf("%w: %q", ErrNamespace, cfg.Namespace)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	ns := cfg.Namespace
	s := &Store{js: js, ns: ns, runs: map[keel.RunID]*runState{}, onLazyError: cfg.OnLazyError, quit: make(chan struct{})}
	var b [8]byte
	rand.Read(b[:])
	s.id = hex.EncodeToString(b[:])
	var err error
	if s.journal, err = EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: ns + "_JOURNAL", Subjects: []string{ns + ".journal.>"}, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		// Reads go to the stream's leader (no direct get from a replica
		// that may lag): a run read after its last append sees it.
		AllowDirect: false, DenyDelete: true, DenyPurge: true,
	}); err != nil {
		return nil, fmt.Errorf("jsstore: journal stream: %w", err)
	}
	if s.spans, err = EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: ns + "_SPANS", Subjects: []string{ns + ".spans.*"}, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	}); err != nil {
		return nil, fmt.Errorf("jsstore: spans stream: %w", err)
	}
	if s.heads, err = EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: ns + "_runs", Storage: jetstream.FileStorage, Replicas: cfg.Replicas}); err != nil {
		return nil, fmt.Errorf("jsstore: heads bucket: %w", err)
	}
	if s.idem, err = EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: ns + "_idem", Storage: jetstream.FileStorage, Replicas: cfg.Replicas}); err != nil {
		return nil, fmt.Errorf("jsstore: idempotency bucket: %w", err)
	}
	return s, nil
}

// EnsureStream returns the stream cfg names, creating it with cfg if it
// does not exist; one that exists is used as it is (its replicas, say,
// are not changed).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, cfg.Name) // created meanwhile
		}
	}
	return s, err
}

// EnsureKeyValue is EnsureStream for a key-value bucket.
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, err
}

// token makes s one subject token and key-value key: s itself when it
// is letters, digits, '-' and '_' (run and span IDs are), else '=' and
// its base64url.
func token(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == "" {
		return s
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(s))
}

func (s *Store) runSubject(id keel.RunID) string { return s.ns + ".journal." + token(string(id)) }

// batch is one journal message: one append.
type batch struct {
	Run    *keel.Run       `json:"run,omitempty"` // the first message of a run
	Events []keel.Event    `json:"events,omitempty"`
	Update *keel.RunUpdate `json:"update,omitempty"`
}

// head is a run's entry in the heads bucket.
type head struct {
	Run     keel.Run `json:"run"`
	Through uint64   `json:"through"` // the journal's stream sequence it reflects
}

// state returns the Store's state of run id, made on first use.
func (s *Store) state(id keel.RunID) *runState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.runs[id]
	if st == nil {
		st = &runState{}
		s.runs[id] = st
	}
	return st
}

// forget drops the state of a run that does not exist.
func (s *Store) forget(id keel.RunID, st *runState) {
	s.mu.Lock()
	if s.runs[id] == st {
		delete(s.runs, id)
	}
	s.mu.Unlock()
}

// refresh brings st (locked) up to the journal's last message of run id:
// one request when nothing was appended elsewhere, and one more per
// message appended since. A run with no journal is keel.ErrNotFound.
func (s *Store) refresh(ctx context.Context, id keel.RunID, st *runState) error {
	subj := s.runSubject(id)
	var last *jetstream.RawStreamMsg
	err := retry(ctx, func(ctx context.Context) (err error) {
		last, err = s.journal.GetLastMsgForSubject(ctx, subj)
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("run %s: %w", id, keel.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("run %s: %w", id, err)
	}
	if st.loaded && last.Sequence == st.through {
		return nil
	}
	first := !st.loaded
	if last.Sequence < st.through || !st.loaded {
		st.reset() // read it all again
	}
	for seq := st.through + 1; ; {
		m := last
		if seq != last.Sequence {
			if err = retry(ctx, func(ctx context.Context) (err error) {
				m, err = s.journal.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
				return err
			}); err != nil {
				return fmt.Errorf("run %s: journal from %d: %w", id, seq, err)
			}
		}
		if err := st.apply(m.Sequence, m.Data); err != nil {
			return fmt.Errorf("run %s: journal message %d: %w", id, m.Sequence, err)
		}
		if m.Sequence >= last.Sequence {
			break
		}
		seq = m.Sequence + 1
	}
	if first {
		s.repairHead(ctx, st)
	}
	return nil
}

// apply folds one journal message into st.
func (st *runState) apply(seq uint64, data []byte) error {
	var b batch
	if err := json.Unmarshal(data, &b); err != nil {
		return err
	}
	if b.Run != nil {
		st.run, st.loaded = *b.Run, true
	}
	if !st.loaded {
		return errors.New("the run's first message has no run")
	}
	st.fold(b.Events, b.Update)
	st.through = seq
	return nil
}

// reset forgets what st knew of its run (not its lock).
func (st *runState) reset() {
	st.loaded, st.run, st.through, st.evs = false, keel.Run{}, 0, nil
}

// fold applies an append's stored events and status change to st.
func (st *runState) fold(evs []keel.Event, upd *keel.RunUpdate) {
	st.evs = append(st.evs, evs...)
	if n := len(evs); n > 0 {
		st.run.LastSeq, st.run.UpdatedAt = evs[n-1].Seq, evs[n-1].Time
	}
	if upd != nil {
		st.run.Status, st.run.Result, st.run.Error = upd.Status, upd.Result, upd.Error
	}
}

// CreateRun stores a new run. It fails with keel.ErrConflict if the ID
// exists or another run has its idempotency key.
func (s *Store) CreateRun(ctx context.Context, r keel.Run) error {
	_, err := s.create(ctx, r, nil, nil)
	return err
}

// CreateRunWith stores a new run and its first events (as AppendAll) in
// one journal message: the run is there with them, or not at all.
func (s *Store) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	if len(evs) == 0 {
		return nil, fmt.Errorf("create run %s: no events", r.ID)
	}
	return s.create(ctx, r, evs, upd)
}

func (s *Store) create(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	r.LastSeq, r.Warnings = 0, nil
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	if err := s.publishSpans(true); err != nil {
		return nil, fmt.Errorf("create run %s: %w", r.ID, err)
	}
	var undoKey func()
	if r.IdempotencyKey != "" {
		var err error
		if undoKey, err = s.claimKey(ctx, r); err != nil {
			return nil, fmt.Errorf("create run %s: %w", r.ID, err)
		}
	}
	out := number(r.ID, 0, evs)
	b := batch{Run: &r, Events: out, Update: upd}
	data, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("create run %s: %w", r.ID, err)
	}
	st := s.state(r.ID)
	st.mu.Lock()
	defer st.mu.Unlock()
	ack, err := s.publish(ctx, s.runSubject(r.ID), data, 0)
	if err != nil {
		if undoKey != nil {
			undoKey()
		}
		return nil, fmt.Errorf("create run %s: %w", r.ID, mapErr(err))
	}
	st.reset()
	st.loaded, st.run, st.through = true, r, ack.Sequence
	st.fold(out, upd)
	s.putHead(ctx, st)
	return out, nil
}

// claimKey points r's idempotency key at r, and returns how to undo it.
// A key already pointing at a run that exists is keel.ErrConflict; one
// pointing at a run whose creation never reached the journal (a crash
// between the two) is taken over.
func (s *Store) claimKey(ctx context.Context, r keel.Run) (undo func(), err error) {
	// Each request is retried as the journal's are (a lost answer while a
	// leader changes): a second Create or Update of one that went through
	// finds the key taken, and its run not created yet, so takes it over.
	k := keyOf(r.IdempotencyKey)
	var rev uint64
	err = retry(ctx, func(ctx context.Context) (err error) {
		rev, err = s.idem.Create(ctx, k, []byte(r.ID))
		return err
	})
	if errors.Is(err, jetstream.ErrKeyExists) {
		var e jetstream.KeyValueEntry
		if gerr := retry(ctx, func(ctx context.Context) (err error) {
			e, err = s.idem.Get(ctx, k)
			return err
		}); gerr != nil {
			return nil, fmt.Errorf("idempotency key: %w", gerr)
		}
		if string(e.Value()) != string(r.ID) {
			lerr := retry(ctx, func(ctx context.Context) error {
				_, err := s.journal.GetLastMsgForSubject(ctx, s.runSubject(keel.RunID(e.Value())))
				return err
			})
			if !errors.Is(lerr, jetstream.ErrMsgNotFound) {
				return nil, fmt.Errorf("idempotency key %q is run %s's: %w", r.IdempotencyKey, e.Value(), keel.ErrConflict)
			}
		}
		err = retry(ctx, func(ctx context.Context) (err error) {
			rev, err = s.idem.Update(ctx, k, []byte(r.ID), e.Revision())
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency key: %w", mapErr(err))
	}
	return func() {
		// Best effort: a key left behind is taken over by the next
		// creation that finds its run missing.
		s.idem.Delete(context.WithoutCancel(ctx), k, jetstream.LastRevision(rev))
	}, nil
}

func keyOf(idempotencyKey string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return hex.EncodeToString(sum[:])
}

// number gives evs their run and sequence numbers after last.
func number(id keel.RunID, last int64, evs []keel.Event) []keel.Event {
	out := make([]keel.Event, len(evs))
	for i, ev := range evs {
		out[i] = keel.Event{RunID: id, Seq: last + 1 + int64(i), Type: ev.Type, Time: ev.Time.UTC(), Data: ev.Data}
	}
	return out
}

// GetRun returns one run or keel.ErrNotFound.
func (s *Store) GetRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	st := s.state(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := s.refresh(ctx, id, st); err != nil {
		if errors.Is(err, keel.ErrNotFound) {
			s.forget(id, st)
		}
		return keel.Run{}, err
	}
	st.lost = false
	return st.run, nil
}

// Events returns the run's events with Seq > afterSeq in order, or
// keel.ErrNotFound.
func (s *Store) Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	st := s.state(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := s.refresh(ctx, id, st); err != nil {
		if errors.Is(err, keel.ErrNotFound) {
			s.forget(id, st)
		}
		return nil, err
	}
	st.lost = false
	i, _ := slices.BinarySearchFunc(st.evs, afterSeq+1, func(ev keel.Event, seq int64) int { return int(ev.Seq - seq) })
	return slices.Clone(st.evs[i:]), nil
}

// AppendAll adds events to the run's journal in one message, numbered
// after its last, upd applying with the last. It fails with
// keel.ErrConflict when the run's status forbids it (see
// keel.CanTransition) or when another Store appended to the run since
// this one last read or wrote it: nothing is stored then, and the next
// read of the run shows the other's events.
func (s *Store) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	if len(evs) == 0 {
		return nil, fmt.Errorf("append to %s: no events", id)
	}
	// A span that is the only record of something is durable no later
	// than the journal's next write (engine.Tracer); the others go
	// beside it, unwaited (see spans.go).
	if err := s.publishSpans(true); err != nil {
		return nil, fmt.Errorf("append %s to %s: %w", evs[0].Type, id, err)
	}
	defer s.settle()
	st := s.state(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lost {
		return nil, fmt.Errorf("append %s to %s: another writer appended to the run since this store's last append; read the run before appending: %w", evs[0].Type, id, keel.ErrConflict)
	}
	if !st.loaded {
		if err := s.refresh(ctx, id, st); err != nil {
			if errors.Is(err, keel.ErrNotFound) {
				s.forget(id, st)
			}
			return nil, fmt.Errorf("append %s: %w", evs[0].Type, err)
		}
	}
	if cur := st.run.Status; cur.Terminal() || (upd != nil && !keel.CanTransition(cur, upd.Status)) {
		to := cur
		if upd != nil {
			to = upd.Status
		}
		return nil, fmt.Errorf("append %s to %s: run is %s, cannot become %s: %w", evs[0].Type, id, cur, to, keel.ErrConflict)
	}
	out := number(id, st.run.LastSeq, evs)
	data, err := json.Marshal(batch{Events: out, Update: upd})
	if err != nil {
		return nil, fmt.Errorf("append %s to %s: %w", evs[0].Type, id, err)
	}
	ack, err := s.publish(ctx, s.runSubject(id), data, st.through)
	if err != nil {
		if errors.Is(mapErr(err), keel.ErrConflict) {
			// Another Store appended: this one's appends to the run were
			// built on what it knew, which is stale. It appends nothing
			// more (a writer that lost its run to an adopter must not
			// journal the run's end after it) until the run is read
			// again, by GetRun or Events: whoever reads it knows what
			// it appends to.
			st.loaded, st.lost = false, true
		}
		return nil, fmt.Errorf("append %s to %s: %w", evs[0].Type, id, mapErr(err))
	}
	changed := upd != nil && upd.Status != st.run.Status
	st.fold(out, upd)
	st.through = ack.Sequence
	if changed {
		s.putHead(ctx, st)
	}
	return out, nil
}

// publish appends data to a run's subject if its last message is
// still last (its stream sequence; 0: none). The message carries an ID
// of its own (this Store's and a counter), and a publish that may have
// reached the stream without its acknowledgement reaching us (no
// responder while a stream's leader changes, a timeout) is sent again
// with the same ID until ctx ends: the stream stores it once and
// acknowledges the copy as a duplicate, where without the ID the append
// guard would refuse the copy as a conflict. It gives up after
// retryFor (the engine appends with a context that never ends).
func (s *Store) publish(ctx context.Context, subj string, data []byte, last uint64) (*jetstream.PubAck, error) {
	id := fmt.Sprintf("%s-%d", s.id, s.seq.Add(1))
	ctx, cancel := context.WithTimeout(ctx, retryFor)
	defer cancel()
	for wait, sent := 50*time.Millisecond, false; ; wait = min(2*wait, time.Second) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := s.js.Publish(actx, subj, data, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgID(id))
		cancel()
		if sent && errors.Is(mapErr(err), keel.ErrConflict) {
			// A copy refused by the guard may be refused because of the
			// first: while a new leader applies the entries the old one
			// committed, its duplicate check can miss the ID while the
			// guard sees the message. Ours if the run's last message
			// carries our ID.
			if seq, ok := s.lastIsOurs(ctx, subj, id); ok {
				return &jetstream.PubAck{Stream: s.ns + "_JOURNAL", Sequence: seq, Duplicate: true}, nil
			}
		}
		if err == nil || !(retryable(err) || inProcess(err)) || ctx.Err() != nil {
			return ack, err
		}
		sent = true
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// lastIsOurs reports whether the last message of subj carries message
// ID id, and its stream sequence.
func (s *Store) lastIsOurs(ctx context.Context, subj, id string) (uint64, bool) {
	var last *jetstream.RawStreamMsg
	if err := retry(ctx, func(ctx context.Context) (err error) {
		last, err = s.journal.GetLastMsgForSubject(ctx, subj)
		return err
	}); err != nil || last.Header.Get(jetstream.MsgIDHeader) != id {
		return 0, false
	}
	return last.Sequence, true
}

// retry calls read until it succeeds or fails in a way that is not
// retryable (a read while a stream's leader changes finds no
// responder), for retryFor at most.
func retry(ctx context.Context, read func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, retryFor)
	defer cancel()
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		err := read(actx)
		acancel()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// inProcess reports whether a publish was refused because another
// message to its subject was in process at the stream's leader (proposed
// and not yet applied): code 10164 without a sequence. That message may
// be this publish's own first copy, still in flight while a leader
// changes (the duplicate check only knows applied messages): sent again,
// the copy is acknowledged as a duplicate once the first is applied, or
// refused with the sequence that is last (10071, a conflict) if the
// message in process was another writer's.
func inProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// retryFor bounds how long an append is sent again: longer than a
// stream's leader election.
const retryFor = 30 * time.Second

// retryable reports whether a publish failed in a way that leaves its
// outcome unknown, and may go through if sent again: no stream answered
// (a leader election), or no answer came in time.
func retryable(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// putHead writes st's run to the heads bucket, unless the bucket has a
// later one. Best effort: the journal is the truth, and a head left
// behind is repaired by the next read of the run that finds it so (see
// repairHead) or by RunsWithStatus.
func (s *Store) putHead(ctx context.Context, st *runState) {
	ctx = context.WithoutCancel(ctx)
	data, err := json.Marshal(head{Run: st.run, Through: st.through})
	if err != nil {
		return
	}
	k := token(string(st.run.ID))
	for range 3 {
		e, err := s.heads.Get(ctx, k)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = s.heads.Create(ctx, k, data)
		case err == nil:
			var h head
			if json.Unmarshal(e.Value(), &h) == nil && h.Through >= st.through {
				return
			}
			_, err = s.heads.Update(ctx, k, data, e.Revision())
		}
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
			return
		}
	}
}

// repairHead writes st's head when the bucket's is missing or behind.
func (s *Store) repairHead(ctx context.Context, st *runState) {
	var e jetstream.KeyValueEntry
	err := retry(ctx, func(ctx context.Context) (err error) {
		e, err = s.heads.Get(ctx, token(string(st.run.ID)))
		return err
	})
	if err == nil {
		var h head
		if json.Unmarshal(e.Value(), &h) == nil && h.Run.Status == st.run.Status {
			return
		}
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return
	}
	s.putHead(ctx, st)
}

// RunsWithStatus returns every run in one of the given states, oldest
// first. It reads every head, and the journal of each run whose head is
// not terminal (a head may lag its journal).
func (s *Store) RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error) {
	if len(states) == 0 {
		return nil, nil
	}
	w, err := s.heads.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer w.Stop()
	var ids []keel.RunID
	var out []keel.Run
	for e := range w.Updates() {
		if e == nil {
			break // the bucket's current contents are all delivered
		}
		var h head
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			return nil, fmt.Errorf("list runs: head %s: %w", e.Key(), err)
		}
		switch {
		case !h.Run.Status.Terminal():
			ids = append(ids, h.Run.ID)
		case slices.Contains(states, h.Run.Status):
			out = append(out, h.Run) // final: its head is its journal's
		}
	}
	for _, id := range ids {
		r, err := s.GetRun(ctx, id)
		if errors.Is(err, keel.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		if slices.Contains(states, r.Status) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b keel.Run) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(string(a.ID), string(b.ID))
	})
	return out, nil
}

// RunByIdempotencyKey returns the run created with key, or
// keel.ErrNotFound.
func (s *Store) RunByIdempotencyKey(ctx context.Context, key string) (keel.Run, error) {
	var e jetstream.KeyValueEntry
	err := retry(ctx, func(ctx context.Context) (err error) {
		e, err = s.idem.Get(ctx, keyOf(key))
		return err
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", keel.ErrNotFound)
	}
	if err != nil {
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", err)
	}
	r, err := s.GetRun(ctx, keel.RunID(e.Value()))
	if err != nil {
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", err)
	}
	if r.IdempotencyKey != key {
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", keel.ErrNotFound)
	}
	return r, nil
}

// mapErr maps JetStream's refusals to the seam's errors: a wrong last
// sequence (another writer appended, or the run exists) is
// keel.ErrConflict.
func mapErr(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return fmt.Errorf("%w: %v", keel.ErrConflict, err)
		}
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: %v", keel.ErrConflict, err)
	}
	return err
}

// Close writes the buffered spans and waits for the span writes under
// way (at most 5 s). The connection is the caller's.
func (s *Store) Close() error {
	s.spanMu.Lock()
	s.closed = true
	if s.lazy != nil {
		s.lazy.Stop()
		s.lazy = nil
	}
	s.spanMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.Sync(ctx)
	close(s.quit)
	return err
}
