-- Model-call accounting on spans (issue 4): what served the call, its cost
-- in US dollars, time to first token, retries, finish reason, and the
-- route, A/B variant and failed attempts as JSON.
ALTER TABLE spans ADD COLUMN provider TEXT NOT NULL DEFAULT '';
ALTER TABLE spans ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE spans ADD COLUMN ttft INTEGER NOT NULL DEFAULT 0;
ALTER TABLE spans ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE spans ADD COLUMN finish_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE spans ADD COLUMN attrs TEXT NOT NULL DEFAULT '';

-- What model calls spent per UTC day, for the daily budget.
CREATE TABLE model_spend (
    day    TEXT PRIMARY KEY,
    tokens INTEGER NOT NULL,
    usd    REAL NOT NULL
);

-- A run's model policy: cloud allowed, private content, budget (JSON of
-- keel.RunPolicy; '' is the default policy).
ALTER TABLE runs ADD COLUMN policy TEXT NOT NULL DEFAULT '';
