//! Webhooks: where alert events go (`/admin/webhooks`), and the dispatcher that delivers
//! them from the outbox (`alert_events`, written with the ledger entries the events are
//! read from; see `crate::engine::alerts`).
//!
//! Deliveries follow the Standard Webhooks specification: at least once, with the same
//! `webhook-id` on every attempt, signed with the endpoint's secret. Deciding a consume
//! never waits on a webhook: the dispatcher reads the outbox on its own time.

mod dispatch;
pub(crate) mod sign;
mod store;
pub(crate) mod target;

pub(crate) use dispatch::{Counts, Dispatcher};
pub(crate) use store::{Delivery, StoreError, Webhook, WebhookStore};

/// The event types an endpoint may ask for.
pub(crate) const EVENT_TYPES: [&str; 3] = [
    crate::engine::alerts::REACHED,
    crate::engine::alerts::RESOLVED,
    TEST_EVENT,
];

/// The type of the event `POST /admin/webhooks/{id}/test` sends.
pub(crate) const TEST_EVENT: &str = "webhook.test";
