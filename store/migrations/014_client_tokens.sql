-- Per-client tokens (keel token create): the SHA-256 of each secret (hex),
-- never the secret; scopes and origin patterns as JSON arrays of strings;
-- times in Unix nanoseconds, 0 for "never".
CREATE TABLE client_tokens (
    name       TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    origins    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL DEFAULT 0,
    last_used  INTEGER NOT NULL DEFAULT 0
);
