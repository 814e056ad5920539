-- Webhook endpoints (src/webhooks): where alert events are delivered, signed with the
-- secret (Standard Webhooks); during a rotation the previous secret signs too, until
-- previous_until. events and actions are comma-separated filters ('' for all). cursor is
-- the last alert_events.seq fanned out to the endpoint's deliveries. failing_since is when
-- its current run of failed attempts began; after 24 hours of them it is disabled.
CREATE TABLE webhooks (
    id             TEXT PRIMARY KEY,
    url            TEXT NOT NULL,
    secret         TEXT NOT NULL,
    previous_secret TEXT,
    previous_until TIMESTAMPTZ,
    events         TEXT NOT NULL,
    actions        TEXT NOT NULL,
    enabled        BOOLEAN NOT NULL,
    cursor_seq     BIGINT NOT NULL,
    failing_since  TIMESTAMPTZ,
    disabled_at    TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL
);

-- One event to deliver to one endpoint: pending until an attempt gets a 2xx answer. A
-- dispatcher claims a due delivery by moving next_attempt_at past the attempt's timeout
-- first, so two dispatchers never attempt one delivery at once.
CREATE TABLE webhook_deliveries (
    webhook_id      TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_seq       BIGINT NOT NULL,
    event_type      TEXT NOT NULL,
    payload         TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    last_status     BIGINT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    delivered_at    TIMESTAMPTZ,
    PRIMARY KEY (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (state, next_attempt_at);
