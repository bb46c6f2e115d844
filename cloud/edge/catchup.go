package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go/jetstream"
)

// Journal reads the daemon's journal: what ipc.History serves.
type Journal interface {
	// RunPage returns a page of runs (q.Limit between 1 and 1000).
	RunPage(ctx context.Context, q keel.RunQuery) (keel.RunPage, error)
	// Events returns a run's events with Seq > afterSeq, in order.
	Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error)
}

// catchUp gives the outbox, through the filter, every event of the
// journal it misses: those an edge that stopped between journaling them
// and storing them in the outbox (a crash) never stored, and those
// journaled while no edge took them (a daemon's Recover runs before it
// joins). A run is looked at closer only if the outbox holds fewer of
// its events than its last seq (one stream info for all runs); for such
// a run the outbox's last event names where to go on. It runs before
// the outbox takes the events queued since Join: per run, the outbox
// stays in journal order.
func (e *Edge) catchUp(ctx context.Context) error {
	out, err := e.local.Stream(ctx, OutboxStream)
	if err != nil {
		return err
	}
	info, err := out.Info(ctx, jetstream.WithSubjectFilter(outboxSubject+">"))
	if err != nil {
		return err
	}
	have := info.State.Subjects
	sent := 0
	q := keel.RunQuery{Limit: 1000}
	for {
		page, err := e.src.Journal.RunPage(ctx, q)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		for _, r := range page.Runs {
			if r.LastSeq <= int64(have[outboxSubject+string(r.ID)]) {
				continue
			}
			last, err := e.outboxLast(ctx, out, r.ID)
			if err != nil {
				return err
			}
			evs, err := e.src.Journal.Events(ctx, r.ID, last)
			if err != nil {
				return fmt.Errorf("journal: %w", err)
			}
			for _, ev := range evs {
				if err := e.publish(ctx, ev); err != nil {
					return err
				}
				sent++
			}
			e.mu.Lock()
			e.caught[r.ID] = max(e.caught[r.ID], r.LastSeq)
			if n := len(evs); n > 0 {
				e.caught[r.ID] = max(e.caught[r.ID], evs[n-1].Seq)
			}
			e.mu.Unlock()
		}
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	if sent > 0 {
		e.log.Info("edge: the outbox caught up with the journal", logkey.Edge, e.cfg.Name, logkey.Events, sent)
	}
	return nil
}

// outboxLast returns the seq of run id's last event in the outbox; 0 if
// none.
func (e *Edge) outboxLast(ctx context.Context, out jetstream.Stream, id keel.RunID) (int64, error) {
	m, err := out.GetLastMsgForSubject(ctx, outboxSubject+string(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var ev struct {
		Seq int64 `json:"seq"`
	}
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return 0, fmt.Errorf("outbox %s: %w", id, err)
	}
	return ev.Seq, nil
}
