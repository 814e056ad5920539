-- A `void` entry: a charge or hold given back because its request was answered 503 while
-- Redis may still have decided it (engine::void).
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check CHECK (kind IN
    ('charge', 'refund', 'hold', 'commit', 'release', 'expire', 'deny', 'void'));
