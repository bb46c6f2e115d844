-- Grants belong to a module, not to a name: sha256 is the hex SHA-256 of
-- the .wasm file the user granted. A module of another digest under the
-- same name gets nothing until the user confirms. Rows from before have
-- an empty sha256; the daemon binds each to the digest installed at its
-- first start with this schema.
ALTER TABLE tool_grants ADD COLUMN sha256 TEXT NOT NULL DEFAULT '';
