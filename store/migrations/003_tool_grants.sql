-- What the user granted each tool. A row, even with empty grants, records
-- that the user decided; no row means the tool was never granted anything.
CREATE TABLE tool_grants (
    tool       TEXT PRIMARY KEY,
    grants     TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
