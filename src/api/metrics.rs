//! `GET /metrics`, and the timing of engine calls that the quota handlers record.

use super::problem::ApiError;
use super::AppState;
use crate::engine::{ConsumeRequest, Consumed, Decision};
use crate::metrics::{Endpoint, Live, CONTENT_TYPE};
use actix_web::{get, web, HttpResponse};
use std::time::Instant;

/// Prometheus metrics in the text exposition format (version 0.0.4).
///
/// Open without a token, like the health checks, so that a scraper needs no secret:
/// operators should firewall it (or keep it on an internal network). Nothing in it names
/// a subject; `action` and `policy` labels take only the values of configured policies.
#[utoipa::path(tag = "health", responses(
    (status = 200, description = "Counters, histograms and gauges", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8"),
))]
#[get("/metrics")]
pub(crate) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let live = Live {
        circuit_open: state.engine.counters().circuit_open(),
        janitor: state.engine.janitor().held(),
        ledger_backlog: state.engine.measure_backlog().await,
        ledger_backlog_max: state.engine.backlog_max(),
        store_memory: state.engine.counters().memory().await,
        in_flight: state.admission.in_flight(),
        max_in_flight: state.admission.limits().in_flight,
        queued: state.admission.queued(),
        overloaded: state.admission.shed(),
        paced: state.admission.paced(),
        ledger_lag: state.ledger_lag.snapshot(),
        counter_drift_budgets: state.engine.recovery().drift_watch().budgets(),
        alerts: alerts_live(&state).await,
        clock_offset_seconds: state
            .time
            .as_ref()
            .and_then(|time| time.offset_ms())
            .map(|ms| ms as f64 / 1e3),
        decision_calls: state.engine.counters().decision_calls(),
    };
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .body(state.metrics.render(state.engine.policies(), &live))
}

/// The alert outbox and the dispatcher's counts.
async fn alerts_live(state: &AppState) -> crate::metrics::AlertsLive {
    use std::sync::atomic::Ordering;
    let counts = &state.webhook_counts;
    let mut live = crate::metrics::AlertsLive {
        delivered: counts.delivered.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
        disabled: counts.disabled.load(Ordering::Relaxed),
        ..Default::default()
    };
    if let Ok((emitted, depth, oldest)) = state.webhooks.backlog().await {
        live.emitted = u64::try_from(emitted).ok();
        live.outbox_depth = u64::try_from(depth).ok();
        let now = state.engine.now();
        live.oldest_pending_seconds =
            oldest.map(|at| (now - at).num_milliseconds().max(0) as f64 / 1e3);
    }
    live
}

/// Checks `request`, recording the latency and result of the decision.
pub(super) async fn check(
    state: &AppState,
    request: &ConsumeRequest,
) -> Result<Decision, ApiError> {
    let started = Instant::now();
    let outcome = state.engine.decider().check(request).await;
    let elapsed = started.elapsed();
    state.metrics.observe(
        Endpoint::Check,
        request.action.as_str(),
        elapsed,
        outcome.as_ref(),
    );
    Ok(outcome?)
}

/// Consumes (or, with `hold_ttl`, holds) `request`, timing and counting the decision.
pub(super) async fn consume(
    state: &AppState,
    request: &ConsumeRequest,
    hold_ttl: Option<u64>,
) -> Result<Consumed, ApiError> {
    let started = Instant::now();
    let outcome = match hold_ttl {
        None => state.engine.decider().consume(request).await,
        Some(ttl) => state.engine.decider().hold(request, ttl).await,
    };
    let elapsed = started.elapsed();
    state.metrics.observe(
        Endpoint::Consume,
        request.action.as_str(),
        elapsed,
        outcome.as_ref().map(|c| &c.decision),
    );
    Ok(outcome?)
}
