//! Prometheus metrics: counters and histograms in a `prometheus_client` registry, and
//! gauges read at scrape time, rendered by [`Metrics::render`] for `GET /metrics` in the
//! Prometheus text format (version 0.0.4).
//!
//! Label values are bounded by configuration: `action` and `policy` only ever take the
//! values of configured policies (a request for an action without policies is counted
//! under the fixed label [`UNKNOWN_ACTION`], never under the raw value, so a caller
//! cannot create series at will), and nothing is labelled by subject: subjects are
//! unbounded and personal data. A series, once created, stays until the process exits,
//! so the series of a deleted policy are bounded by the policies configured since.
//!
//! Request and decision series appear once they have counted something; latency, store
//! errors and build info are always present, and so are the gauges, but for the last
//! reload (before the first one) and the ledger backlog (without Redis).
//!
//! - `labels`: the label sets, and how their values are spelled.
//! - `scrape`: the gauges built at scrape time from the policy cache and [`Live`].
//! - `text`: prometheus-client writes OpenMetrics; this turns it into 0.0.4.

mod labels;
mod scrape;
mod text;

use crate::engine::decision::policies::PolicyCache;
use crate::engine::store::{StoreError, StoreMemory};
use crate::engine::{Decision, EngineError};
use labels::{
    AuthFailureLabels, DecisionLabels, EndpointLabels, RequestLabels, RequestResult,
    StoreErrorLabels,
};
use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The media type of [`Metrics::render`]'s output.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `action` label of a request whose action is not configured (never the raw value).
pub(crate) const UNKNOWN_ACTION: &str = "(unknown)";

/// The quota endpoint a request came through (the `endpoint` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Endpoint {
    /// `POST /quota/consume`.
    Consume,
    /// `POST /quota/check`.
    Check,
    /// Envoy's `ShouldRateLimit` (gRPC): one request, every descriptor's policies.
    RateLimit,
}

impl Endpoint {
    const ALL: [Self; 3] = [Self::Consume, Self::Check, Self::RateLimit];

    fn label(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Check => "check",
            Self::RateLimit => "should_rate_limit",
        }
    }
}

/// Upper bounds of the latency histogram's buckets, in seconds (`+Inf` is implicit).
const BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The `kind` label values of `quota_store_errors_total`.
const STORE_ERROR_KINDS: [&str; 3] = ["unavailable", "timeout", "protocol"];

/// Gauges read from the stores at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Live {
    /// Whether the counter store's circuit breaker is open (calls fail without trying).
    pub(crate) circuit_open: bool,
    /// Whether this instance holds the janitor lease.
    pub(crate) janitor: bool,
    /// Ledger entries in the Redis streams not yet moved to SQL; `None` without Redis (or
    /// when Redis did not answer).
    pub(crate) ledger_backlog: Option<u64>,
    /// The bound on the backlog (`QUOTA_LEDGER_BACKLOG_MAX`); `None` without Redis.
    pub(crate) ledger_backlog_max: Option<u64>,
    /// Redis's memory (`None` without Redis, or when it did not answer).
    pub(crate) store_memory: Option<StoreMemory>,
    /// `/quota/*` requests being served now.
    pub(crate) in_flight: usize,
    /// The most `/quota/*` requests served at once.
    pub(crate) max_in_flight: usize,
    /// `/quota/*` requests waiting for a slot now.
    pub(crate) queued: usize,
    /// `/quota/*` requests answered 503 overloaded since the start.
    pub(crate) overloaded: u64,
    /// `/quota/*` requests paced while the ledger's drain was behind, since the start.
    pub(crate) paced: u64,
    /// How long ledger entries took from their decision to their SQL commit.
    pub(crate) ledger_lag: crate::engine::pipeline::lag::LagSnapshot,
    /// Budgets whose counters drifted from the ledger at the last verify; `None` before.
    pub(crate) counter_drift_budgets: Option<u64>,
    /// Alert events and their webhook deliveries.
    pub(crate) alerts: AlertsLive,
    /// Redis's clock minus this machine's, seconds; `None` without Redis.
    pub(crate) clock_offset_seconds: Option<f64>,
    /// Decisions sent to Redis and the script calls that carried them; `None` without Redis.
    pub(crate) decision_calls: Option<crate::engine::store::DecisionCalls>,
}

/// Alert events and their webhook deliveries, as a scrape sees them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AlertsLive {
    /// Events ever written to the outbox; `None` when the database did not answer.
    pub(crate) emitted: Option<u64>,
    /// Events not yet fanned out to every enabled endpoint.
    pub(crate) outbox_depth: Option<u64>,
    /// How long the oldest pending delivery has waited, seconds (`None`: none, or unknown).
    pub(crate) oldest_pending_seconds: Option<f64>,
    /// Attempts of this instance answered 2xx.
    pub(crate) delivered: u64,
    /// Attempts of this instance that failed.
    pub(crate) failed: u64,
    /// Endpoints this instance disabled after a day of failures.
    pub(crate) disabled: u64,
}

/// The service's metrics; shared by every worker.
///
/// The fields are handles to the families registered in `registry` (cloning one shares
/// its series), kept to record into without looking families up by name.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    durations: Family<EndpointLabels, Histogram>,
    store_errors: Family<StoreErrorLabels, Counter>,
    /// Consumes and checks allowed only because the store was down and we fail open.
    degraded_allows: Counter,
    /// Requests refused by the gate (401 and 403), by reason.
    auth_failures: Family<AuthFailureLabels, Counter>,
}

/// The reasons a request is refused by the gate: each is a series from the start.
pub(crate) const AUTH_FAILURE_REASONS: [&str; 5] =
    ["missing", "unknown", "expired", "revoked", "forbidden"];

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Registry::default(),
            requests: Family::default(),
            decisions: Family::default(),
            durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            store_errors: Family::default(),
            degraded_allows: Counter::default(),
            auth_failures: Family::default(),
        };
        // Series that are always present, at zero until something happens.
        for endpoint in Endpoint::ALL {
            drop(
                metrics
                    .durations
                    .get_or_create(&EndpointLabels { endpoint }),
            );
        }
        for kind in STORE_ERROR_KINDS {
            drop(metrics.store_errors.get_or_create(&store_error(kind)));
        }
        for reason in AUTH_FAILURE_REASONS {
            drop(
                metrics
                    .auth_failures
                    .get_or_create(&AuthFailureLabels { reason }),
            );
        }
        metrics.registered()
    }
}

impl Metrics {
    /// An empty registry (the always-present series at zero).
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Registers every family, in the order they are rendered. Counter names have no
    /// `_total`: the encoder adds it to samples. Help texts have no final period: the
    /// registry adds one.
    fn registered(mut self) -> Self {
        let registry = &mut self.registry;
        registry.register(
            "quota_requests",
            "Consume and check requests by endpoint, action and result",
            self.requests.clone(),
        );
        registry.register(
            "quota_decisions",
            "Per-policy outcomes of consume and check decisions (shadow policies over their limit count as denied)",
            self.decisions.clone(),
        );
        registry.register(
            "quota_decision_duration_seconds",
            "Time the engine took to answer a consume or check (every call, errors included)",
            self.durations.clone(),
        );
        registry.register(
            "quota_store_errors",
            "Counter-store failures: unavailable (unreachable), timeout (no answer in time) or protocol (unexpected answers)",
            self.store_errors.clone(),
        );
        registry.register(
            "quota_degraded_allows",
            "Consumes and checks allowed unchecked because the counter store was down (QUOTA_ON_STORE_ERROR=allow)",
            self.degraded_allows.clone(),
        );
        registry.register(
            "quota_auth_failures",
            "Requests refused for who sent them: missing, unknown, expired or revoked token or key (401), or a key that may not do it (forbidden, 403)",
            self.auth_failures.clone(),
        );
        self
    }

    /// Counts a request refused by the gate, by `reason` (one of [`AUTH_FAILURE_REASONS`];
    /// another value is counted as `unknown`, so the series stay bounded).
    pub(crate) fn auth_refused(&self, reason: &'static str) {
        let reason = AUTH_FAILURE_REASONS
            .into_iter()
            .find(|known| *known == reason)
            .unwrap_or("unknown");
        self.auth_failures
            .get_or_create(&AuthFailureLabels { reason })
            .inc();
    }

    /// Counts one consume or check that reached the engine: its latency, its result, one
    /// decision per policy entry (a shadow policy over its limit counts as `denied` for
    /// that policy though the request passed), and any counter-store failure.
    ///
    /// `action` is the request's action; it is used as a label only when the engine
    /// knew it. A degraded answer records no policy decisions: none were evaluated.
    pub(crate) fn observe(
        &self,
        endpoint: Endpoint,
        action: &str,
        elapsed: Duration,
        outcome: Result<&Decision, &EngineError>,
    ) {
        self.observe_together(endpoint, action, elapsed, outcome.map(std::slice::from_ref));
    }

    /// [`Metrics::observe`] for one request whose decisions were made together (Envoy's
    /// descriptors): one request, allowed or denied as a whole, and every decision's
    /// policies. A request without decisions counts for nothing.
    pub(crate) fn observe_together(
        &self,
        endpoint: Endpoint,
        action: &str,
        elapsed: Duration,
        outcome: Result<&[Decision], &EngineError>,
    ) {
        let outcome = match outcome {
            Ok([]) => return,
            Ok(decisions) => Ok(decisions),
            Err(error) => Err(error),
        };
        self.durations
            .get_or_create(&EndpointLabels { endpoint })
            .observe(elapsed.as_secs_f64());
        self.observe_store(outcome.map(|decisions| &decisions[0]));
        let (action, result, decisions) = match outcome {
            Ok(decisions) if decisions[0].degraded => {
                self.degraded_allows.inc();
                (action, RequestResult::Degraded, &[][..])
            }
            Ok(decisions) if decisions[0].allowed => (action, RequestResult::Allowed, decisions),
            Ok(decisions) => (action, RequestResult::Denied, decisions),
            Err(EngineError::UnknownAction(_)) => {
                (UNKNOWN_ACTION, RequestResult::UnknownAction, &[][..])
            }
            Err(EngineError::Store(
                StoreError::Unavailable(_)
                | StoreError::NotConnected(_)
                | StoreError::Timeout(_)
                | StoreError::Misconfigured(_)
                | StoreError::Unreplicated(_)
                | StoreError::Rebuilding { .. },
            )) => (action, RequestResult::Unavailable, &[][..]),
            Err(EngineError::Store(StoreError::Protocol(_)) | EngineError::Broken(_)) => {
                (action, RequestResult::Error, &[][..])
            }
            Err(EngineError::Conflict(_) | EngineError::NotFound(_) | EngineError::Invalid(_)) => {
                (action, RequestResult::Invalid, &[][..])
            }
            Err(EngineError::Ledger(_)) => (action, RequestResult::Unavailable, &[][..]),
            Err(EngineError::Overloaded) => (action, RequestResult::Overloaded, &[][..]),
            Err(EngineError::BacklogFull { .. }) => (action, RequestResult::BacklogFull, &[][..]),
        };
        self.count(endpoint, action, result, decisions);
    }

    /// Counts one consume or check rejected before the engine (400, 413, 415, 422).
    ///
    /// `action` is whatever the body said, if it could be read; it becomes a label only
    /// when `cache` has policies for it, else the request counts under [`UNKNOWN_ACTION`].
    pub(crate) fn observe_invalid(
        &self,
        endpoint: Endpoint,
        action: Option<&str>,
        cache: &PolicyCache,
    ) {
        let action = action
            .filter(|a| cache.action(a).is_some())
            .unwrap_or(UNKNOWN_ACTION);
        self.count(endpoint, action, RequestResult::Invalid, &[]);
    }

    /// Counts the counter-store failure behind `outcome`, if any (a degraded answer hides
    /// one); for engine calls other than consume and check, such as usage reads.
    pub(crate) fn observe_store(&self, outcome: Result<&Decision, &EngineError>) {
        let kind = match outcome {
            Ok(decision) if decision.degraded => "unavailable",
            Err(EngineError::Store(
                StoreError::Unavailable(_)
                | StoreError::NotConnected(_)
                | StoreError::Misconfigured(_)
                | StoreError::Unreplicated(_),
            )) => "unavailable",
            Err(EngineError::Store(StoreError::Timeout(_))) => "timeout",
            Err(EngineError::Store(StoreError::Protocol(_))) => "protocol",
            // Redis answered: it is the shard that waits for its rebuild, not a failure.
            Ok(_)
            | Err(EngineError::Store(StoreError::Rebuilding { .. }))
            | Err(
                EngineError::UnknownAction(_)
                | EngineError::NotFound(_)
                | EngineError::Invalid(_)
                | EngineError::Conflict(_)
                | EngineError::Ledger(_)
                | EngineError::Broken(_)
                | EngineError::Overloaded
                | EngineError::BacklogFull { .. },
            ) => return,
        };
        self.store_errors.get_or_create(&store_error(kind)).inc();
    }

    /// Every metric, with the policy cache's and `live` gauges, as Prometheus text (0.0.4).
    pub(crate) fn render(&self, cache: &PolicyCache, live: &Live) -> String {
        let mut open_metrics = String::new();
        let scraped = scrape::registry(cache, live);
        for registry in [&self.registry, &scraped] {
            // Writing to a String cannot fail, and every gauge value fits the encoder's
            // range, so an error here is a bug; the scrape still gets what was written.
            if encode_registry(&mut open_metrics, registry).is_err() {
                tracing::error!("encoding the metrics failed; the scrape is incomplete");
            }
        }
        text::prometheus_0_0_4(&open_metrics)
    }

    /// Increments the request series of `action` and its policies' decision series.
    fn count(
        &self,
        endpoint: Endpoint,
        action: &str,
        result: RequestResult,
        decisions: &[Decision],
    ) {
        let request = RequestLabels {
            endpoint,
            action: action.to_owned(),
            result,
        };
        self.requests.get_or_create(&request).inc();
        for policy in decisions.iter().flat_map(|d| &d.policies) {
            let decision = DecisionLabels {
                endpoint,
                action: request.action.clone(),
                policy: policy.policy_id.to_string(),
                mode: policy.mode,
                outcome: if policy.allowed { "allowed" } else { "denied" },
            };
            self.decisions.get_or_create(&decision).inc();
        }
    }
}

/// The labels of one counter-store error series.
fn store_error(kind: &'static str) -> StoreErrorLabels {
    StoreErrorLabels {
        store: "counter",
        kind,
    }
}

#[cfg(test)]
mod tests;
