-- Policies: one limit on one action. Money and counts are INTEGER (64-bit) minor units.
CREATE TABLE policies (
    id             TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    action         TEXT NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    measure        TEXT NOT NULL CHECK (measure IN ('count', 'amount')),
    unit           TEXT,
    limit_value    INTEGER NOT NULL CHECK (limit_value BETWEEN 0 AND 9007199254740991),
    window_spec    TEXT NOT NULL,
    mode           TEXT NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    enabled        BOOLEAN NOT NULL,
    ledger_denials BOOLEAN NOT NULL DEFAULT FALSE,
    description    TEXT NOT NULL DEFAULT '',
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 1)
);

CREATE INDEX policies_action_idx ON policies (action);

-- Per-subject limits replacing a policy's limit.
CREATE TABLE policy_overrides (
    policy_id   TEXT NOT NULL REFERENCES policies (id) ON DELETE CASCADE,
    subject     TEXT NOT NULL CHECK (length(CAST(subject AS BLOB)) BETWEEN 1 AND 256),
    limit_value INTEGER NOT NULL CHECK (limit_value BETWEEN 0 AND 9007199254740991),
    expires_at  TEXT,
    note        TEXT,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (policy_id, subject)
);
