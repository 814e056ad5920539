-- alert_thresholds: the percents of a policy's limit at which its budgets' usage is
-- reported (src/domain/alerts.rs, Thresholds), ascending and comma-separated ("50,80,100");
-- NULL when it has none. A release before it selects its own columns and never reads this
-- one, so a policy with thresholds is not created while such a release runs
-- (src/policy/keys.rs, ensure_readable).
ALTER TABLE policies ADD COLUMN alert_thresholds TEXT;
