-- match_not: the values for which a policy does not apply (src/domain/budget.rs, Match),
-- a JSON object of arrays as match_spec is; NULL when it has none. A release before it
-- selects its own columns and never reads this one, so a policy with a match_not is not
-- created while such a release runs (src/policy/keys.rs, ensure_readable).
ALTER TABLE policies ADD COLUMN match_not_spec TEXT;
