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
    })
}

/// Every store answers.
#[utoipa::path(tag = "health", responses(
    (status = 200, description = "Ready", body = Health),
    (status = 503, description = "A store is down, or the ledger backlog is full", body = Health),
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
    let ready = policy_ok && counters.store != Some(false) && backlog_full != Some(true);
    let body = Health {
        status: if ready { "ok" } else { "unavailable" }.to_owned(),
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
