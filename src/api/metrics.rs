//! `GET /metrics`, and the timing of engine calls that the quota handlers record.

use super::problem::ApiError;
use super::AppState;
use crate::engine::{ConsumeRequest, Decision};
use crate::metrics::{Endpoint, CONTENT_TYPE};
use actix_web::{get, web, HttpResponse};
use std::time::Instant;

/// Prometheus metrics in the text exposition format (version 0.0.4).
///
/// Open without a token, like the health checks, so that a scraper needs no secret:
/// operators should firewall it (or keep it on an internal network). Nothing in it names
/// a subject; `action` and `policy` labels take only the values of configured policies.
#[utoipa::path(tag = "health", responses(
    (status = 200, description = "Counters, histograms and gauges", body = String,
        content_type = "text/plain; version=0.0.4"),
))]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .body(state.metrics.render(&state.cache))
}

/// Asks the engine for a decision, recording its latency and result under `endpoint`.
pub(super) async fn decide(
    state: &AppState,
    endpoint: Endpoint,
    request: &ConsumeRequest,
    commit: bool,
) -> Result<Decision, ApiError> {
    let started = Instant::now();
    let outcome = state.engine.decide(request, commit).await;
    let elapsed = started.elapsed();
    state
        .metrics
        .observe(endpoint, request.action.as_str(), elapsed, &outcome);
    Ok(outcome?)
}
