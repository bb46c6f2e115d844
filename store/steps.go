package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
)

// The steps other environments hand to this one (cloud/edge): their
// offers are kept beside the runs that carry them out, so that what the
// edge promised (only a step's origin may cancel its run) holds after a
// restart.

// offerCols reads a step_offers row o with its run r (LEFT JOIN).
const offerCols = `o.idempotency_key, o.origin, o.traceparent, COALESCE(r.id, ''), o.cancelled`

// qOffer reads the offer of a key with its run.
const qOffer = `SELECT ` + offerCols + ` FROM step_offers o LEFT JOIN runs r ON r.idempotency_key = o.idempotency_key WHERE o.idempotency_key = ?`

// OfferStep records offer (its Key, Origin and TraceParent) as the offer
// of the step whose run has idempotency key offer.Key, unless one is
// recorded already, and returns the offer as recorded: the first offer's
// origin and trace context, and the run of the key if there is one.
func (s *Store) OfferStep(ctx context.Context, offer keel.StepOffer) (keel.StepOffer, error) {
	var o keel.StepOffer
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO step_offers (idempotency_key, origin, traceparent, created_at) VALUES (?, ?, ?, ?)
ON CONFLICT (idempotency_key) DO NOTHING`, offer.Key, offer.Origin, offer.TraceParent, nanos(time.Now())); err != nil {
			return err
		}
		var err error
		o, err = scanOffer(tx.QueryRowContext(ctx, qOffer, offer.Key))
		return err
	})
	if err != nil {
		return keel.StepOffer{}, fmt.Errorf("offer of step %s: %w", offer.Key, mapErr(err))
	}
	return o, nil
}

// CancelStepOffer records that origin cancelled the step whose run has
// idempotency key key, if origin is the step's origin or no offer of key
// is recorded yet (origin becomes its origin), and returns the offer as
// recorded: another origin's offer is returned unchanged.
func (s *Store) CancelStepOffer(ctx context.Context, key, origin string) (keel.StepOffer, error) {
	var o keel.StepOffer
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO step_offers (idempotency_key, origin, cancelled, created_at) VALUES (?, ?, 1, ?)
ON CONFLICT (idempotency_key) DO UPDATE SET cancelled = 1 WHERE step_offers.origin = excluded.origin`, key, origin, nanos(time.Now())); err != nil {
			return err
		}
		var err error
		o, err = scanOffer(tx.QueryRowContext(ctx, qOffer, key))
		return err
	})
	if err != nil {
		return keel.StepOffer{}, fmt.Errorf("cancel the offer of step %s: %w", key, mapErr(err))
	}
	return o, nil
}

// StepOfferOf returns the offer of the step run carries out, or an error
// wrapping keel.ErrNotFound when run is not the run of a step offered.
func (s *Store) StepOfferOf(ctx context.Context, run keel.RunID) (keel.StepOffer, error) {
	o, err := scanOffer(s.r.QueryRowContext(ctx, `SELECT `+offerCols+` FROM runs r JOIN step_offers o ON o.idempotency_key = r.idempotency_key
WHERE r.id = ?`, string(run)))
	if err != nil {
		return keel.StepOffer{}, fmt.Errorf("offer of the step of run %s: %w", run, mapErr(err))
	}
	return o, nil
}

func scanOffer(row *sql.Row) (keel.StepOffer, error) {
	var o keel.StepOffer
	var run string
	if err := row.Scan(&o.Key, &o.Origin, &o.TraceParent, &run, &o.Cancelled); err != nil {
		return keel.StepOffer{}, err
	}
	o.Run = keel.RunID(run)
	return o, nil
}
