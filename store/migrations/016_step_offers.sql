-- The steps other environments handed to this one (an edge joined to a
-- cloud, docs/cloud.md): who offered the step whose run has the
-- idempotency key, so that only that origin may cancel the run, after a
-- restart too. The first offer's origin stays.
CREATE TABLE step_offers (
    idempotency_key TEXT PRIMARY KEY,
    origin          TEXT NOT NULL,
    created_at      INTEGER NOT NULL
);
