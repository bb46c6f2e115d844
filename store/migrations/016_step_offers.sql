-- The steps other environments handed to this one (an edge joined to a
-- cloud, docs/cloud.md): who offered the step whose run has the
-- idempotency key, so that only that origin may cancel the run, after a
-- restart too. The first offer's origin stays. cancelled is 1 once that
-- origin cancelled the step, maybe before any offer came: no run of the
-- key starts then. traceparent is the W3C trace context the offer
-- carried: the run's spans are exported in the origin's trace.
CREATE TABLE step_offers (
    idempotency_key TEXT PRIMARY KEY,
    origin          TEXT NOT NULL,
    traceparent     TEXT NOT NULL DEFAULT '',
    cancelled       INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL
);
