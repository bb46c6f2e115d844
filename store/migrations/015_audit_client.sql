-- Who asked for a direct tool call, as the client declared itself
-- (keel.ToolAudit.Client, such as "mcp:NAME" for an MCP client); '' for
-- a run's call, a client that named no one, and rows written before.
ALTER TABLE tool_audit ADD COLUMN client TEXT NOT NULL DEFAULT '';
