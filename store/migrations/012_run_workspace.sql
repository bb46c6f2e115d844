-- The workspace a run names (keel.Run.Workspace): the directory whose
-- .keel/policy.json is the run's workspace policy layer; '' for none.
ALTER TABLE runs ADD COLUMN workspace TEXT NOT NULL DEFAULT '';
