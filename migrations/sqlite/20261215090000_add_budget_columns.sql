-- Budgets (scopes, attributes and conditions).
-- A ledger entry keeps the request's attributes: a JSON object of strings, NULL when none.
ALTER TABLE ledger_entries ADD COLUMN attributes TEXT;
-- A policy's scope, as its key names joined by ',' ('' is the global scope); NULL is the
-- default scope, ["subject"].
ALTER TABLE policies ADD COLUMN scope TEXT;
-- A policy's `match`: a JSON object of arrays of strings; NULL when it always applies.
ALTER TABLE policies ADD COLUMN match_spec TEXT;
