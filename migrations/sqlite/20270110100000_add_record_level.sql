-- A policy's record level (`record`): `entries` (one ledger entry per consume, the
-- default and what every policy written before records) or `totals` (the ledger's totals
-- per budget and counter period, `ledger_totals`).
ALTER TABLE policies ADD COLUMN record_level TEXT NOT NULL DEFAULT 'entries';
