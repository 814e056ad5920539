-- API keys (src/access): a name, the action globs and operations a key may use, an
-- optional expiry. The secret itself is never stored: only its SHA-256, in hex. A revoked
-- key keeps its row (revoked_at set): the list shows it, and a request with it is told why.
-- Every change to this table bumps policy_changes, so instances reload keys as they reload
-- policies; last_used_at is written every few seconds and bumps nothing.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    prefix       TEXT NOT NULL,
    secret_hash  TEXT NOT NULL UNIQUE CHECK (length(secret_hash) = 64),
    actions      JSONB NOT NULL,
    operations   JSONB NOT NULL,
    expires_at   TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ,
    last_used_at TIMESTAMPTZ
);
