//! Prometheus metrics: a small registry of atomic counters, rendered in the text
//! exposition format (version 0.0.4) by [`Metrics::render`] for `GET /metrics`.
//!
//! Label values are bounded by configuration: `action` and `policy` only ever take the
//! values of configured policies (a request for an action without policies is counted
//! under the fixed label [`UNKNOWN_ACTION`], never under the raw value, so a caller
//! cannot create series at will), and nothing is labelled by subject: subjects are
//! unbounded and personal data.
//!
//! The hot path takes one uncontended read lock and increments atomics. Series are
//! looked up with borrowed `&str` keys; their label strings are allocated once, the
//! first time an action or policy is seen (under the write lock).

mod text;

use crate::domain::Mode;
use crate::engine::policies::PolicyCache;
use crate::engine::store::StoreError;
use crate::engine::{Decision, EngineError, PolicyDecision};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

/// The media type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `action` label of a request whose action is not configured (never the raw value).
pub const UNKNOWN_ACTION: &str = "(unknown)";

/// The quota endpoint a request came through (the `endpoint` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /quota/consume`.
    Consume,
    /// `POST /quota/check`.
    Check,
}

impl Endpoint {
    const ALL: [Self; 2] = [Self::Consume, Self::Check];

    fn label(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Check => "check",
        }
    }
}

/// How a consume or check ended (the `result` label); the index into the request series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestResult {
    Allowed,
    Denied,
    Degraded,
    UnknownAction,
    Invalid,
    Unavailable,
    Error,
}

impl RequestResult {
    const ALL: [Self; 7] = [
        Self::Allowed,
        Self::Denied,
        Self::Degraded,
        Self::UnknownAction,
        Self::Invalid,
        Self::Unavailable,
        Self::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Degraded => "degraded",
            Self::UnknownAction => "unknown_action",
            Self::Invalid => "invalid",
            Self::Unavailable => "unavailable",
            Self::Error => "error",
        }
    }
}

/// Per-policy decision counts, indexed `[endpoint][mode][outcome]` (see [`MODES`], [`OUTCOMES`]).
type PolicySeries = [[[AtomicU64; 2]; 2]; 2];

/// The `mode` label values, by their index in a [`PolicySeries`].
const MODES: [&str; 2] = ["enforce", "shadow"];

/// The `outcome` label values, by their index in a [`PolicySeries`].
const OUTCOMES: [&str; 2] = ["allowed", "denied"];

/// Every series of one `action` label value.
#[derive(Debug, Default)]
struct ActionSeries {
    /// Requests, indexed `[endpoint][result]`.
    requests: [[AtomicU64; RequestResult::ALL.len()]; 2],
    /// Decisions by policy id.
    policies: HashMap<String, PolicySeries>,
}

/// Upper bounds of the latency histogram's buckets: nanoseconds, and the `le` label.
const BUCKETS: [(u64, &str); 11] = [
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
];

/// A fixed-bucket latency histogram; `counts` are per bucket (the last one is `+Inf`),
/// made cumulative when rendered.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BUCKETS.partition_point(|(bound, _)| *bound < nanos);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Gauges read from the stores at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Live {
    /// Whether the counter store's circuit breaker is open (calls fail without trying).
    pub circuit_open: bool,
    /// Ledger entries in the Redis streams not yet moved to SQL; `None` without Redis (or
    /// when Redis did not answer).
    pub ledger_backlog: Option<u64>,
}

/// The service's metrics; shared by every worker (all counters are atomics).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Request and decision series by `action` label value.
    actions: RwLock<HashMap<String, ActionSeries>>,
    /// Engine latency, indexed by endpoint.
    durations: [Histogram; 2],
    /// Counter-store failures: unreachable (refused, reset, circuit open).
    store_unavailable: AtomicU64,
    /// Counter-store failures: no answer within `QUOTA_REDIS_TIMEOUT_MS`.
    store_timeouts: AtomicU64,
    /// Counter-store failures: unexpected answers (bugs).
    store_protocol: AtomicU64,
    /// Consumes and checks allowed only because the store was down and we fail open.
    degraded_allows: AtomicU64,
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one consume or check that reached the engine: its latency, its result, one
    /// decision per policy entry (a shadow policy over its limit counts as `denied` for
    /// that policy though the request passed), and any counter-store failure.
    ///
    /// `action` is the request's action; it is used as a label only when the engine
    /// knew it. A degraded answer records no policy decisions: none were evaluated.
    pub fn observe(
        &self,
        endpoint: Endpoint,
        action: &str,
        elapsed: Duration,
        outcome: Result<&Decision, &EngineError>,
    ) {
        self.durations[endpoint as usize].observe(elapsed);
        self.observe_store(outcome);
        let (action, result, policies) = match outcome {
            Ok(decision) if decision.degraded => {
                self.degraded_allows.fetch_add(1, Ordering::Relaxed);
                (action, RequestResult::Degraded, &[][..])
            }
            Ok(decision) if decision.allowed => {
                (action, RequestResult::Allowed, &decision.policies[..])
            }
            Ok(decision) => (action, RequestResult::Denied, &decision.policies[..]),
            Err(EngineError::UnknownAction(_)) => {
                (UNKNOWN_ACTION, RequestResult::UnknownAction, &[][..])
            }
            Err(EngineError::Store(StoreError::Unavailable(_) | StoreError::Timeout(_))) => {
                (action, RequestResult::Unavailable, &[][..])
            }
            Err(EngineError::Store(StoreError::Protocol(_))) => {
                (action, RequestResult::Error, &[][..])
            }
            Err(EngineError::Conflict(_) | EngineError::NotFound(_)) => {
                (action, RequestResult::Invalid, &[][..])
            }
            Err(EngineError::Ledger(_)) => (action, RequestResult::Unavailable, &[][..]),
        };
        self.count(endpoint, action, result, policies);
    }

    /// Counts one consume or check rejected before the engine (400, 413, 415, 422).
    ///
    /// `action` is whatever the body said, if it could be read; it becomes a label only
    /// when `cache` has policies for it, else the request counts under [`UNKNOWN_ACTION`].
    pub fn observe_invalid(&self, endpoint: Endpoint, action: Option<&str>, cache: &PolicyCache) {
        let action = action
            .filter(|a| cache.action(a).is_some())
            .unwrap_or(UNKNOWN_ACTION);
        self.count(endpoint, action, RequestResult::Invalid, &[]);
    }

    /// Counts the counter-store failure behind `outcome`, if any (a degraded answer hides
    /// one); for engine calls other than consume and check, such as usage reads.
    pub fn observe_store(&self, outcome: Result<&Decision, &EngineError>) {
        let counter = match outcome {
            Ok(decision) if decision.degraded => &self.store_unavailable,
            Err(EngineError::Store(StoreError::Unavailable(_))) => &self.store_unavailable,
            Err(EngineError::Store(StoreError::Timeout(_))) => &self.store_timeouts,
            Err(EngineError::Store(StoreError::Protocol(_))) => &self.store_protocol,
            Ok(_)
            | Err(
                EngineError::UnknownAction(_)
                | EngineError::NotFound(_)
                | EngineError::Conflict(_)
                | EngineError::Ledger(_),
            ) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Increments the request series and the policies' decision series of `action`,
    /// creating the ones not seen before.
    fn count(
        &self,
        endpoint: Endpoint,
        action: &str,
        result: RequestResult,
        policies: &[PolicyDecision],
    ) {
        let record = |series: &ActionSeries| {
            let by_endpoint = endpoint as usize;
            series.requests[by_endpoint][result as usize].fetch_add(1, Ordering::Relaxed);
            for policy in policies {
                if let Some(counts) = series.policies.get(policy.policy_id.as_str()) {
                    let mode = usize::from(policy.mode == Mode::Shadow);
                    let denied = usize::from(!policy.allowed);
                    counts[by_endpoint][mode][denied].fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        {
            // A poisoned lock only means a panic elsewhere; the counters stay valid.
            let actions = self.actions.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = actions.get(action) {
                let known = |p: &PolicyDecision| series.policies.contains_key(p.policy_id.as_str());
                if policies.iter().all(known) {
                    return record(series);
                }
            }
        }
        let mut actions = self.actions.write().unwrap_or_else(PoisonError::into_inner);
        // The slow path: allocating the keys of every lookup here is fine.
        let series = actions.entry(action.to_owned()).or_default();
        for policy in policies {
            series
                .policies
                .entry(policy.policy_id.to_string())
                .or_default();
        }
        record(series);
    }
}
