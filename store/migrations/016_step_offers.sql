-- The steps other environments handed to this one (an edge joined to a
-- cloud, docs/cloud.md): who offered the step whose run has the
-- idempotency key, so that only that origin may cancel the run, after a
-- restart too. The first offer's origin stays. cancelled is 1 once that
-- origin cancelled the step, maybe before any offer came: no run of the
-- key starts then.
CREATE TABLE step_offers (
    idempotency_key TEXT PRIMARY KEY,
    origin          TEXT NOT NULL,
    cancelled       INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL
);
