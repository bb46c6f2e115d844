-- Runs, their append-only journal of events, and their trace spans.
-- Times are Unix nanoseconds (UTC).
CREATE TABLE runs (
    id         TEXT PRIMARY KEY,
    goal       TEXT NOT NULL,
    model      TEXT NOT NULL,
    status     TEXT NOT NULL,
    result     TEXT NOT NULL DEFAULT '',
    error      TEXT NOT NULL DEFAULT '',
    max_steps  INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_created ON runs (created_at DESC);
CREATE INDEX runs_status ON runs (status);

CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq    INTEGER NOT NULL,
    type   TEXT NOT NULL,
    time   INTEGER NOT NULL,
    data   BLOB,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE spans (
    id                TEXT PRIMARY KEY,
    run_id            TEXT NOT NULL REFERENCES runs (id),
    kind              TEXT NOT NULL,
    name              TEXT NOT NULL,
    step              INTEGER NOT NULL,
    start             INTEGER NOT NULL,
    duration          INTEGER NOT NULL DEFAULT 0,
    status            TEXT NOT NULL,
    error             TEXT NOT NULL DEFAULT '',
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX spans_run ON spans (run_id, start);
