-- A leaner journal write. Spans become one B-tree clustered by run
-- (WITHOUT ROWID, keyed by run and span ID) instead of a rowid table with
-- two indexes, so writing a span touches one page instead of three. A
-- run's last_seq and updated_at are read from its last event (the
-- events key is (run_id, seq)); runs is written only when a run's status
-- changes, and its last_seq and updated_at columns are kept as of then.
CREATE TABLE spans_new (
    run_id            TEXT NOT NULL REFERENCES runs (id),
    id                TEXT NOT NULL,
    kind              TEXT NOT NULL,
    name              TEXT NOT NULL,
    step              INTEGER NOT NULL,
    start             INTEGER NOT NULL,
    duration          INTEGER NOT NULL DEFAULT 0,
    status            TEXT NOT NULL,
    error             TEXT NOT NULL DEFAULT '',
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    provider          TEXT NOT NULL DEFAULT '',
    cost_usd          REAL NOT NULL DEFAULT 0,
    ttft              INTEGER NOT NULL DEFAULT 0,
    retries           INTEGER NOT NULL DEFAULT 0,
    finish_reason     TEXT NOT NULL DEFAULT '',
    attrs             TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;
INSERT INTO spans_new (run_id, id, kind, name, step, start, duration, status, error, prompt_tokens, completion_tokens,
    provider, cost_usd, ttft, retries, finish_reason, attrs)
SELECT run_id, id, kind, name, step, start, duration, status, error, prompt_tokens, completion_tokens,
    provider, cost_usd, ttft, retries, finish_reason, attrs FROM spans;
DROP TABLE spans;
ALTER TABLE spans_new RENAME TO spans;
