-- Orchestration: a run's kind (agent, plan, dag) and, for a step of a
-- plan or DAG run that is itself a run (a sub-agent), its parent and the
-- step it carries out.
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent';
ALTER TABLE runs ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN parent_step TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_parent ON runs (parent_id) WHERE parent_id != '';
