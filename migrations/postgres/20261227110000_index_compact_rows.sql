-- The rows still in the compact form of earlier builds (`policies` NULL), found by an
-- index that is empty once `quota-ledger migrate` has rewritten them: every start looks
-- for them, and without it that look read the whole ledger.
CREATE INDEX ledger_entries_compact_idx ON ledger_entries (seq) WHERE policies IS NULL;
