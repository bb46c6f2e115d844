-- Grants are bound to a tool's grant digest, which covers its sidecar
-- manifest (NAME.manifest.json) when it has one: the .wasm file's SHA-256
-- without a sidecar, a digest over it and the sidecar's bytes with one.
-- Rows from before hold the .wasm file's digest alone; they are marked
-- 'wasm:' here, once, and the daemon binds each at its next start: to the
-- installed tool's grant digest if its .wasm file still has that digest
-- (the sidecar beside it then is the one the user's grant was meant for),
-- else back to the plain digest, pending as before.
UPDATE tool_grants SET sha256 = 'wasm:' || sha256 WHERE sha256 != '';
