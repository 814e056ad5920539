-- The outbox of alert events (src/engine/alerts.rs): a budget's usage reached one of its
-- policy's alert_thresholds, or fell back below it. Each row is written in the same
-- transaction as the ledger entry it is read from, and its id names that entry, the
-- policy and the threshold: an entry inserted twice (a drain's retry) adds no second
-- event. `seq` is the order the dispatcher delivers them in.
CREATE TABLE alert_events (
    seq        BIGSERIAL PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    event_type TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    payload    JSONB NOT NULL
);
