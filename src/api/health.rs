//! Liveness and readiness.

use super::AppState;
use actix_web::{get, web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

/// The state of the process or of its stores.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok`, or `unavailable` when a store is down.
    pub(crate) status: String,
    /// Per store: `ok`, `down` or `embedded` (readiness only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stores: Option<StoreHealth>,
    /// Readiness only: why this instance would answer consumes `503` now (empty when
    /// ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasons: Option<Vec<String>>,
    /// Readiness with Redis: Redis's clock minus this machine's, in seconds, as last
    /// measured (decisions follow Redis's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) clock_offset_seconds: Option<f64>,
    /// Readiness only: what is wrong without stopping this instance from serving (a clock
    /// offset past `QUOTA_MAX_CLOCK_OFFSET_MS`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) warnings: Option<Vec<String>>,
}

/// Reachability of each store.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StoreHealth {
    /// The policy database.
    pub(crate) policy_store: String,
    /// The counter store (Redis, or `embedded` for in-process counters).
    pub(crate) counter_store: String,
    /// Redis only: `ok`, or `full` while `QUOTA_LEDGER_BACKLOG_MAX` ledger entries or more
    /// wait in Redis for SQL (consumes are then answered 503 ledger-backlog-full).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ledger_backlog: Option<String>,
}

/// The process is up.
#[utoipa::path(tag = "health", responses((status = 200, description = "Alive", body = Health)))]
#[get("/healthz")]
pub(crate) async fn healthz() -> web::Json<Health> {
    web::Json(Health {
        status: "ok".to_owned(),
        stores: None,
        reasons: None,
        clock_offset_seconds: None,
        warnings: None,
    })
}

/// This instance would serve consumes: `503`, with the reasons, whenever it would answer
/// them `503` for a reason of its own (a store down under `QUOTA_ON_STORE_ERROR=deny`, an
/// evicting Redis, shards being rebuilt, the ledger backlog full), or the policy store is
/// down.
#[utoipa::path(tag = "health", responses(
    (status = 200, description = "Ready", body = Health),
    (status = 503, description = "Not ready: `reasons` says why", body = Health),
))]
#[get("/readyz")]
pub(crate) async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let word = |ok: bool| if ok { "ok" } else { "down" }.to_owned();
    let policy_ok = state.policies.ping().await.is_ok();
    let counters = state.engine.readiness().await;
    let counter_store = match counters.store {
        Some(ok) => word(ok),
        None => "embedded".to_owned(),
    };
    let backlog_full = counters.backlog_full;
    let mut reasons = counters.reasons;
    if !policy_ok {
        reasons.push("the policy database does not answer".to_owned());
    }
    let ready = reasons.is_empty();
    let offset_ms = state.time.as_ref().and_then(|time| time.offset_ms());
    let max_ms = i64::try_from(state.max_clock_offset.as_millis()).unwrap_or(i64::MAX);
    let warnings = offset_ms
        .filter(|offset| offset.abs() > max_ms)
        .map(|offset| {
            format!(
                "this machine's clock differs from Redis's by {offset} ms, more than \
                 QUOTA_MAX_CLOCK_OFFSET_MS ({max_ms}); decisions follow Redis's clock"
            )
        })
        .into_iter()
        .collect();
    let body = Health {
        status: if ready { "ok" } else { "unavailable" }.to_owned(),
        reasons: Some(reasons),
        clock_offset_seconds: offset_ms.map(|ms| ms as f64 / 1e3),
        warnings: Some(warnings),
        stores: Some(StoreHealth {
            policy_store: word(policy_ok),
            counter_store,
            ledger_backlog: backlog_full.map(|full| if full { "full" } else { "ok" }.to_owned()),
        }),
    };
    match ready {
        true => HttpResponse::Ok().json(body),
        false => HttpResponse::ServiceUnavailable()
            .insert_header((actix_web::http::header::RETRY_AFTER, "5"))
            .json(body),
    }
}
