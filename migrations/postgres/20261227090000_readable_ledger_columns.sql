-- The ledger readable in SQL (README, "The ledger in SQL"): each policy's amount, scope
-- and budget as jsonb in `policies`, the request's attributes as jsonb in `attributes`.
-- Rows written before keep their compact text in `policies_compact` (and `policies` NULL)
-- until `quota-ledger migrate`, run by every start too, rewrites them in batches; new
-- rows leave `policies_compact` at its default. `detail` stays internal: how a charge or
-- hold is given back (its counters), a hold's expiry and a kept answer; never served.
ALTER TABLE ledger_entries RENAME COLUMN policies TO policies_compact;
ALTER TABLE ledger_entries ADD COLUMN policies JSONB;
ALTER TABLE ledger_entries ALTER COLUMN attributes TYPE JSONB USING attributes::jsonb;
