//! The gauges read at scrape time: what the policy cache holds, the counter store's
//! circuit breaker, the ledger backlog and its bound, Redis's memory and the build. They are built fresh for every
//! scrape from the values the handler passes, so nothing has to keep them up to date.

use super::Live;
use crate::engine::decision::policies::PolicyCache;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// A gauge of a count or size, which stops at `i64::MAX`: the text encoder refuses a larger
/// value, and no count gets near it.
fn count(value: impl TryInto<i64>) -> ConstGauge {
    ConstGauge::new(value.try_into().unwrap_or(i64::MAX))
}

/// A registry of this scrape's gauges. A gauge whose value is unknown (no reload yet, no
/// Redis) is left out rather than reported as 0.
///
/// Help texts have no final period: the registry adds one.
#[expect(
    clippy::too_many_lines,
    reason = "one gauge after another, each registered where its value is read"
)]
pub(super) fn registry(cache: &PolicyCache, live: &Live) -> Registry {
    let mut registry = Registry::default();
    let (policies, overrides) = cache.sizes();
    registry.register(
        "quota_policy_cache_policies",
        "Policies in the in-process cache, enabled or not",
        ConstGauge::new(policies),
    );
    registry.register(
        "quota_policy_cache_overrides",
        "Per-subject overrides in the in-process cache",
        ConstGauge::new(overrides),
    );
    if let Some(at) = cache.last_reload() {
        registry.register(
            "quota_policy_cache_last_reload_timestamp_seconds",
            "When the policy cache was last rebuilt (Unix time)",
            ConstGauge::new(at.timestamp_millis() as f64 / 1e3),
        );
    }
    registry.register(
        "quota_counter_store_circuit_open",
        "1 while the counter store's circuit breaker fails calls without trying",
        ConstGauge::new(i64::from(live.circuit_open)),
    );
    registry.register(
        "quota_janitor",
        "1 while this instance is the janitor: it sweeps after dead instances (their ledger entries and holds)",
        ConstGauge::new(i64::from(live.janitor)),
    );
    if let Some(drift) = live.counter_drift_budgets {
        registry.register(
            "quota_counter_drift_budgets",
            "Budgets whose live counter differed from the usage the ledger gives it at the last verify (QUOTA_VERIFY_INTERVAL_S, or GET /admin/counters/verify)",
            count(drift),
        );
    }
    if let Some(offset) = live.clock_offset_seconds {
        registry.register(
            "quota_clock_offset_seconds",
            "Redis's clock minus this machine's, as last measured; decisions follow Redis's clock (QUOTA_MAX_CLOCK_OFFSET_MS warns past a bound)",
            ConstGauge::new(offset),
        );
    }
    if let Some(sent) = live.decision_calls {
        registry.register(
            "quota_redis_decisions",
            "Decisions sent to Redis, each once, alone or in a batch",
            ConstCounter::new(sent.decisions),
        );
        registry.register(
            "quota_redis_decision_calls",
            "Script calls that carried them: while a call is in flight on a connection, the decisions that come next go together in the next one",
            ConstCounter::new(sent.calls),
        );
    }
    if let Some(backlog) = live.ledger_backlog {
        registry.register(
            "quota_ledger_backlog_entries",
            "Ledger entries waiting in the Redis streams to be moved into SQL",
            count(backlog),
        );
    }
    if let Some(max) = live.ledger_backlog_max {
        registry.register(
            "quota_ledger_backlog_max_entries",
            "The most ledger entries that may wait in the Redis streams; consumes are answered 503 ledger-backlog-full at it (QUOTA_LEDGER_BACKLOG_MAX)",
            count(max),
        );
    }
    if let Some(memory) = &live.store_memory {
        registry.register(
            "quota_redis_used_memory_bytes",
            "Memory Redis uses (INFO used_memory, summed over a cluster's nodes)",
            count(memory.used_bytes),
        );
        registry.register(
            "quota_redis_maxmemory_bytes",
            "Redis's maxmemory (summed over a cluster's nodes); 0 when a node has none",
            count(memory.max_bytes),
        );
        let policies = Family::<Vec<(String, String)>, Gauge>::default();
        for policy in &memory.policies {
            policies
                .get_or_create(&vec![("policy".to_owned(), policy.clone())])
                .set(1);
        }
        registry.register(
            "quota_redis_maxmemory_policy",
            "Always 1, labelled with each maxmemory-policy Redis's nodes have (only noeviction is safe)",
            policies,
        );
    }
    registry.register(
        "quota_in_flight_requests",
        "Quota requests being served now (admin, health and metrics are not counted)",
        count(live.in_flight),
    );
    registry.register(
        "quota_max_in_flight_requests",
        "The most quota requests served at once (QUOTA_MAX_IN_FLIGHT)",
        count(live.max_in_flight),
    );
    registry.register(
        "quota_ledger_lag_seconds",
        "Time from a decision to its ledger entry's commit in SQL (the drain in Redis mode, the group commit embedded)",
        LagHistogram(live.ledger_lag.clone()),
    );
    registry.register(
        "quota_queued_requests",
        "Quota requests waiting for a slot now (at most QUOTA_MAX_QUEUED)",
        count(live.queued),
    );
    registry.register(
        "quota_overloaded",
        "Quota requests answered 503 overloaded: no slot came free within QUOTA_QUEUE_WAIT_MS, or the queue was full",
        ConstCounter::new(live.overloaded),
    );
    registry.register(
        "quota_paced",
        "Quota requests that waited 1 ms before being served because the ledger drain's latest commit carried an entry older than QUOTA_LEDGER_PACE_MS",
        ConstCounter::new(live.paced),
    );
    alerts(&mut registry, &live.alerts);
    registry
        .sub_registry_with_label(("version".into(), env!("CARGO_PKG_VERSION").into()))
        .register(
            "quota_build_info",
            "Always 1; labelled with the version",
            ConstGauge::new(1),
        );
    registry
}

/// The alert and webhook series.
fn alerts(registry: &mut Registry, alerts: &super::AlertsLive) {
    if let Some(emitted) = alerts.emitted {
        registry.register(
            "quota_alert_events",
            "Alert events (budget.threshold, budget.threshold.resolved) written to the outbox with their ledger entries",
            ConstCounter::new(emitted),
        );
    }
    if let Some(depth) = alerts.outbox_depth {
        registry.register(
            "quota_alert_outbox_depth",
            "Alert events not yet handed to every enabled webhook endpoint",
            count(depth),
        );
    }
    if let Some(seconds) = alerts.oldest_pending_seconds {
        registry.register(
            "quota_webhook_oldest_pending_seconds",
            "How long the oldest undelivered webhook delivery has waited",
            ConstGauge::new(seconds),
        );
    }
    let deliveries =
        Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
    for (result, count) in [("delivered", alerts.delivered), ("failed", alerts.failed)] {
        deliveries
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc_by(count);
    }
    registry.register(
        "quota_webhook_deliveries",
        "Webhook delivery attempts of this instance, by result (delivered: a 2xx answer)",
        deliveries,
    );
    registry.register(
        "quota_webhooks_disabled",
        "Webhook endpoints this instance disabled after a day of failed attempts (webhook.disabled)",
        ConstCounter::new(alerts.disabled),
    );
}

/// A histogram read from the engine's [`crate::engine::pipeline::lag::Lag`] at scrape time.
#[derive(Debug)]
struct LagHistogram(crate::engine::pipeline::lag::LagSnapshot);

impl prometheus_client::encoding::EncodeMetric for LagHistogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.0.sum,
            self.0.count,
            &self.0.buckets,
            None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}
