-- Policies: one limit on one action. Money and counts are BIGINT minor units.
CREATE TABLE policies (
    id             TEXT PRIMARY KEY CHECK (id ~ '^[a-z0-9._-]{1,64}$'),
    action         TEXT NOT NULL CHECK (action ~ '^[a-z0-9._-]{1,64}$'),
    measure        TEXT NOT NULL CHECK (measure IN ('count', 'amount')),
    unit           TEXT,
    limit_value    BIGINT NOT NULL CHECK (limit_value BETWEEN 0 AND 9007199254740991),
    window_spec    TEXT NOT NULL,
    mode           TEXT NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    enabled        BOOLEAN NOT NULL,
    ledger_denials BOOLEAN NOT NULL DEFAULT FALSE,
    description    TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL,
    version        BIGINT NOT NULL CHECK (version >= 1)
);

CREATE INDEX policies_action_idx ON policies (action);

-- Per-subject limits replacing a policy's limit.
CREATE TABLE policy_overrides (
    policy_id   TEXT NOT NULL REFERENCES policies (id) ON DELETE CASCADE,
    subject     TEXT NOT NULL CHECK (octet_length(subject) BETWEEN 1 AND 256),
    limit_value BIGINT NOT NULL CHECK (limit_value BETWEEN 0 AND 9007199254740991),
    expires_at  TIMESTAMPTZ,
    note        TEXT,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (policy_id, subject)
);
