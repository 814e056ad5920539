-- The ledger: one row per charge, refund, hold, settlement, expiry or recorded denial.
-- Rows are inserted (by the drain or the embedded writer) and deleted (by retention),
-- never updated. `seq` is the insertion order and the pagination key; `id` is the entry's
-- own id, unique so that inserting an entry twice is a no-op (ON CONFLICT DO NOTHING).
CREATE TABLE ledger_entries (
    seq             BIGSERIAL PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE CHECK (length(id) BETWEEN 1 AND 128),
    at              TIMESTAMPTZ NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN
                        ('charge', 'refund', 'hold', 'commit', 'release', 'expire', 'deny')),
    action          TEXT NOT NULL CHECK (action ~ '^[a-z0-9._-]{1,64}$'),
    subject         TEXT NOT NULL CHECK (octet_length(subject) BETWEEN 1 AND 256),
    -- Minor units (or a count): a whole number that is exact in JSON and in Redis Lua.
    amount          BIGINT NOT NULL CHECK (amount BETWEEN 0 AND 9007199254740991),
    consumption_id  TEXT,
    hold_id         TEXT,
    idempotency_key TEXT,
    -- Each policy's amount and scope, in compact text: version `p1`, fields separated by
    -- control characters (src/engine/codec/entry.rs).
    policies        TEXT NOT NULL DEFAULT '[]',
    -- Internal detail (how to give a charge or hold back), in compact text: version `d1`
    -- (src/engine/codec/entry.rs); never served.
    detail          TEXT
);

-- The query API pages newest first by seq, optionally for one subject or one action.
CREATE INDEX ledger_entries_subject_seq_idx ON ledger_entries (subject, seq);
CREATE INDEX ledger_entries_action_seq_idx ON ledger_entries (action, seq);
-- Refunds find their charge and what was refunded already; settlements find their hold.
CREATE INDEX ledger_entries_consumption_idx ON ledger_entries (consumption_id)
    WHERE consumption_id IS NOT NULL;
CREATE INDEX ledger_entries_hold_idx ON ledger_entries (hold_id)
    WHERE hold_id IS NOT NULL;
-- Retention deletes by age.
CREATE INDEX ledger_entries_at_idx ON ledger_entries (at);
