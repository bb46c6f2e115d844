-- Audit trail of every tool call, from runs and direct calls alike.
CREATE TABLE tool_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    time        INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    version     TEXT NOT NULL DEFAULT '',
    sha256      TEXT NOT NULL DEFAULT '',
    run_id      TEXT NOT NULL DEFAULT '',
    step        INTEGER NOT NULL DEFAULT 0,
    call_id     TEXT NOT NULL DEFAULT '',
    args_sha256 TEXT NOT NULL,
    grants      TEXT NOT NULL DEFAULT '[]',
    outcome     TEXT NOT NULL,
    error       TEXT NOT NULL DEFAULT '',
    duration    INTEGER NOT NULL
);
CREATE INDEX tool_audit_tool ON tool_audit (tool, id DESC);
CREATE INDEX tool_audit_run ON tool_audit (run_id);
