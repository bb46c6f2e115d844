-- A client's idempotency key for run.start: a retried start with the same
-- key gets the run the first one created instead of a second run.
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX runs_idempotency_key ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
