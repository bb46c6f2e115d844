-- Traces as trees (issue 13): each span names the span it is part of
-- (a run's root span has none; a sub-agent's root names its parent
-- run's step span), and a model call records the model's digest and
-- hashes of its prompt template and of the whole prompt.
ALTER TABLE spans ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
ALTER TABLE spans ADD COLUMN model_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE spans ADD COLUMN template_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE spans ADD COLUMN prompt_hash TEXT NOT NULL DEFAULT '';
