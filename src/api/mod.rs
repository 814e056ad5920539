//! The HTTP API: handlers, wire shapes, problem+json errors and the OpenAPI document.
//!
//! This is the only module that knows HTTP. Routes are registered through
//! `utoipa-actix-web`, so the served routes and the documented ones cannot diverge.

pub(crate) mod activity;
pub(crate) mod admin;
pub mod admission;
mod backtest;
pub(crate) mod console;
pub(crate) mod dto;
pub(crate) mod extract;
pub(crate) mod health;
pub(crate) mod keys;
pub(crate) mod ledger;
pub(crate) mod metrics;
pub mod openapi;
pub(crate) mod payments;
pub(crate) mod problem;
pub(crate) mod quota;
pub(crate) mod request_id;
pub(crate) mod responses;
pub(crate) mod routing;
mod timestamp;
pub(crate) mod verify;
mod webhooks;
pub(crate) mod wire;

use crate::access::Gate;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::policy::{Caches, PolicyAdmin, PolicyStore};
use std::sync::Arc;

/// What every handler shares.
pub(crate) struct AppState {
    /// The quota engine.
    pub(crate) engine: Arc<Engine>,
    /// Policy persistence (admin reads and writes go here).
    pub(crate) policies: Arc<dyn PolicyStore>,
    /// What a change reloads: the engine's policy cache and the API keys.
    pub(crate) caches: Caches,
    /// Who may do what (the tokens and the keys).
    pub(crate) gate: Arc<Gate>,
    /// Days the ledger keeps entries (`QUOTA_LEDGER_RETENTION_DAYS`): a period longer than
    /// that could not be rebuilt from it.
    pub(crate) ledger_retention_days: Option<u32>,
    /// What `/metrics` reports; the quota handlers record into it.
    pub(crate) metrics: Arc<Metrics>,
    /// Bounds the `/quota/*` requests in flight.
    pub(crate) admission: Arc<crate::admission::Admission>,
    /// How long ledger entries took to reach SQL (the drain and the writer record it).
    pub(crate) ledger_lag: Arc<crate::engine::pipeline::lag::Lag>,
    /// The webhook endpoints and their deliveries.
    pub(crate) webhooks: crate::webhooks::WebhookStore,
    /// Whether webhook endpoints may resolve to private addresses.
    pub(crate) webhook_allow_private: bool,
    /// What the webhook dispatcher counted, for `/metrics`.
    pub(crate) webhook_counts: Arc<crate::webhooks::Counts>,
    /// Held while a backtest runs: one at a time per instance.
    pub(crate) backtests: Arc<tokio::sync::Mutex<()>>,
    /// Redis's clock as this instance measures it; `None` without Redis (or on a test's
    /// clock).
    pub(crate) time: Option<Arc<crate::clock::OffsetClock>>,
    /// The offset from Redis's clock past which the instance warns
    /// (`QUOTA_MAX_CLOCK_OFFSET_MS`).
    pub(crate) max_clock_offset: std::time::Duration,
}

impl AppState {
    /// Policy and override writes, each followed by a reload of the engine's policy cache so that
    /// this instance enforces the change from its next request on.
    pub(crate) fn policy_admin(&self) -> PolicyAdmin<'_> {
        PolicyAdmin::new(self.policies.as_ref(), &self.caches)
    }
}

/// Registers every documented route.
pub(crate) fn routes(config: &mut utoipa_actix_web::service_config::ServiceConfig) {
    config
        .service(quota::consume)
        .service(quota::check)
        .service(quota::usage)
        .service(ledger::list_ledger)
        .service(payments::refund)
        .service(payments::create_hold)
        .service(payments::commit_hold)
        .service(payments::release_hold)
        .service(admin::list_policies)
        .service(admin::create_policy)
        .service(admin::get_policy)
        .service(admin::replace_policy)
        .service(admin::delete_policy)
        .service(admin::list_overrides)
        .service(admin::get_override)
        .service(admin::put_override)
        .service(admin::delete_override)
        .service(keys::create_key)
        .service(keys::list_keys)
        .service(keys::revoke_key)
        .service(keys::whoami)
        .service(backtest::backtest)
        .service(webhooks::create_webhook)
        .service(webhooks::list_webhooks)
        .service(webhooks::get_webhook)
        .service(webhooks::put_webhook)
        .service(webhooks::delete_webhook)
        .service(webhooks::rotate_secret)
        .service(webhooks::test_webhook)
        .service(webhooks::list_deliveries)
        .service(activity::activity)
        .service(verify::verify)
        .service(health::healthz)
        .service(health::readyz)
        .service(metrics::metrics);
}
