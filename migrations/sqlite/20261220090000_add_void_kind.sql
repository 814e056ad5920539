-- A `void` entry: a charge or hold given back because its request was answered 503 while
-- Redis may still have decided it (engine::void). SQLite cannot change a CHECK constraint
-- in place: the table is copied into a new one, keeping every `seq` and the highest
-- `seq` ever given (AUTOINCREMENT never reuses one).
CREATE TABLE ledger_entries_new (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE CHECK (length(id) BETWEEN 1 AND 128),
    at              TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN
                        ('charge', 'refund', 'hold', 'commit', 'release', 'expire', 'deny', 'void')),
    action          TEXT NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    subject         TEXT NOT NULL CHECK (length(CAST(subject AS BLOB)) BETWEEN 1 AND 256),
    amount          INTEGER NOT NULL CHECK (amount BETWEEN 0 AND 9007199254740991),
    consumption_id  TEXT,
    hold_id         TEXT,
    idempotency_key TEXT,
    policies        TEXT NOT NULL DEFAULT '[]',
    detail          TEXT,
    attributes      TEXT
);
INSERT INTO ledger_entries_new (seq, id, at, kind, action, subject, amount, consumption_id,
        hold_id, idempotency_key, policies, detail, attributes)
    SELECT seq, id, at, kind, action, subject, amount, consumption_id, hold_id,
        idempotency_key, policies, detail, attributes
    FROM ledger_entries;
DELETE FROM sqlite_sequence WHERE name = 'ledger_entries_new';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'ledger_entries_new', seq FROM sqlite_sequence WHERE name = 'ledger_entries';
DROP TABLE ledger_entries;
ALTER TABLE ledger_entries_new RENAME TO ledger_entries;
CREATE INDEX ledger_entries_subject_seq_idx ON ledger_entries (subject, seq);
CREATE INDEX ledger_entries_action_seq_idx ON ledger_entries (action, seq);
CREATE INDEX ledger_entries_consumption_idx ON ledger_entries (consumption_id)
    WHERE consumption_id IS NOT NULL;
CREATE INDEX ledger_entries_hold_idx ON ledger_entries (hold_id)
    WHERE hold_id IS NOT NULL;
CREATE INDEX ledger_entries_at_idx ON ledger_entries (at);
