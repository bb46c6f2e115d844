-- Every decision in the tool audit record (keel.ToolAudit): the policy's
-- decision about the call (JSON, '' for none), the labels of its output
-- and the network hosts it reached or tried (JSON arrays), the requests
-- the policy refused (JSON array of keel.EgressRefusal, '' for none).
-- Rows written before have none of them.
ALTER TABLE tool_audit ADD COLUMN policy TEXT NOT NULL DEFAULT '';
ALTER TABLE tool_audit ADD COLUMN labels TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tool_audit ADD COLUMN hosts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tool_audit ADD COLUMN refused TEXT NOT NULL DEFAULT '';
