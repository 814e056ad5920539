//! The HTTP API: handlers, wire shapes, problem+json errors and the OpenAPI document.
//!
//! This is the only module that knows HTTP. Routes are registered through
//! `utoipa-actix-web`, so the served routes and the documented ones cannot diverge.

pub mod admin;
pub mod dto;
pub mod extract;
pub mod health;
pub mod ledger;
pub mod metrics;
pub mod openapi;
pub mod payments;
pub mod problem;
pub mod quota;
pub mod request_id;
pub mod routing;
mod timestamp;
pub mod wire;

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::policy::{PolicyAdmin, PolicyStore};
use std::sync::Arc;

/// What every handler shares.
pub struct AppState {
    /// The quota engine.
    pub engine: Arc<Engine>,
    /// Policy persistence (admin reads and writes go here).
    pub policies: Arc<dyn PolicyStore>,
    /// True when counters are in-process (no Redis configured).
    pub embedded_counters: bool,
    /// What `/metrics` reports; the quota handlers record into it.
    pub metrics: Arc<Metrics>,
}

impl AppState {
    /// Policy and override writes, each followed by a reload of the engine's policy cache so that
    /// this instance enforces the change from its next request on.
    pub fn policy_admin(&self) -> PolicyAdmin<'_> {
        PolicyAdmin::new(self.policies.as_ref(), self.engine.policies())
    }
}

/// Registers every documented route.
pub fn routes(config: &mut utoipa_actix_web::service_config::ServiceConfig) {
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
        .service(health::healthz)
        .service(health::readyz)
        .service(metrics::metrics);
}
