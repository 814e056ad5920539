//! The quota engine: turns a consume into one atomic counter-store call and a [`Decision`].
//!
//! The engine resolves the action's policies from the cache, computes each policy's
//! window parameters from the clock (calendar boundaries in the policy's time zone),
//! builds one [`store::Charge`] per policy, and asks the counter store to apply all or
//! none of them. A denial is a value ([`Decision::allowed`] is false), not an error.

pub mod clock;
pub mod keys;
pub mod store;
pub mod window;

use crate::config::OnStoreError;
use crate::domain::{Action, Measure, Mode, Policy, PolicyId, Quantity, Subject, Window};
use crate::policy::PolicyCache;
use chrono::{DateTime, TimeZone, Utc};
use clock::Clock;
use std::sync::Arc;
use store::{Algorithm, Charge, CounterStore, Outcome, StoreError};

/// One request to charge (or check) `amount` for `subject` doing `action`.
#[derive(Debug, Clone)]
pub struct ConsumeRequest {
    /// What is being done.
    pub action: Action,
    /// Who does it.
    pub subject: Subject,
    /// How much, in minor units (count policies charge 1 regardless).
    pub amount: Quantity,
}

/// One policy's part of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDecision {
    /// The policy.
    pub policy_id: PolicyId,
    /// Count or amount.
    pub measure: Measure,
    /// Enforce or shadow.
    pub mode: Mode,
    /// The limit that applied (an override's, if any).
    pub limit: u64,
    /// Usage after this decision.
    pub used: u64,
    /// `limit - used`, never below zero.
    pub remaining: u64,
    /// When usage would be back to zero with no further consumption.
    pub resets_at: DateTime<Utc>,
    /// Whether this policy alone would allow the request.
    pub allowed: bool,
    /// The window's length in seconds (for the `RateLimit-Policy` header).
    pub window_seconds: u64,
}

/// The answer to a consume or check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is (or would be) allowed.
    pub allowed: bool,
    /// Seconds until the same request would pass; `None` if allowed or if it never can.
    pub retry_after_seconds: Option<u64>,
    /// True when the counter store was down and `QUOTA_ON_STORE_ERROR=allow` let it through.
    pub degraded: bool,
    /// One entry per enabled policy, ordered by policy id.
    pub policies: Vec<PolicyDecision>,
    /// When the decision was made.
    pub at: DateTime<Utc>,
}

/// Why the engine could not decide.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The action has no policies: never a silent allow.
    #[error("no policy limits the action '{0}'")]
    UnknownAction(Action),
    /// The counter store failed and the configuration says fail closed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The quota engine; cheap to share (`Arc` inside).
pub struct Engine {
    counters: Arc<dyn CounterStore>,
    cache: Arc<PolicyCache>,
    clock: Arc<dyn Clock>,
    prefix: String,
    on_store_error: OnStoreError,
}

impl Engine {
    /// Builds the engine over its stores.
    pub fn new(
        counters: Arc<dyn CounterStore>,
        cache: Arc<PolicyCache>,
        clock: Arc<dyn Clock>,
        prefix: String,
        on_store_error: OnStoreError,
    ) -> Self {
        Self {
            counters,
            cache,
            clock,
            prefix,
            on_store_error,
        }
    }

    /// The counter store (for readiness checks).
    pub fn counters(&self) -> &dyn CounterStore {
        self.counters.as_ref()
    }

    /// Decides `request`; charges all policies when `commit` is true and it is allowed.
    pub async fn decide(
        &self,
        request: &ConsumeRequest,
        commit: bool,
    ) -> Result<Decision, EngineError> {
        self.run(request, request.amount, commit).await
    }

    /// Current usage of every enabled policy of the action for the subject; charges nothing.
    pub async fn usage(&self, action: &Action, subject: &Subject) -> Result<Decision, EngineError> {
        let request = ConsumeRequest {
            action: action.clone(),
            subject: subject.clone(),
            amount: Quantity::ZERO,
        };
        self.run(&request, Quantity::ZERO, false).await
    }

    async fn run(
        &self,
        request: &ConsumeRequest,
        amount: Quantity,
        commit: bool,
    ) -> Result<Decision, EngineError> {
        let policies = self
            .cache
            .action(request.action.as_str())
            .ok_or_else(|| EngineError::UnknownAction(request.action.clone()))?;
        let now = self.clock.now();
        let now_ms = now.timestamp_millis();
        let tag = keys::subject_prefix(&self.prefix, &request.action, &request.subject);
        let subject = request.subject.as_str();
        let mut charges = Vec::with_capacity(policies.enabled.len());
        let mut window_seconds = Vec::with_capacity(policies.enabled.len());
        for policy in &policies.enabled {
            let (algorithm, period, seconds) = algorithm_for(policy, now);
            let cost = match amount.get() {
                0 => 0,
                _ => policy.spec.measure.cost(amount).get(),
            };
            charges.push(Charge {
                key: keys::counter_key(&tag, policy, period),
                algorithm,
                limit: policies.limit_for(policy, subject, now),
                cost,
                enforce: policy.spec.mode == Mode::Enforce,
            });
            window_seconds.push(seconds);
        }
        if charges.is_empty() {
            return Ok(Decision {
                allowed: true,
                retry_after_seconds: None,
                degraded: false,
                policies: Vec::new(),
                at: now,
            });
        }
        let evaluation = match self.counters.evaluate(now_ms, &charges, commit).await {
            Ok(evaluation) => evaluation,
            Err(StoreError::Unavailable(why)) if self.on_store_error == OnStoreError::Allow => {
                tracing::warn!(error = %why, "counter store unavailable; allowing (degraded)");
                return Ok(degraded(now, &policies.enabled, &charges, &window_seconds));
            }
            Err(error) => return Err(error.into()),
        };
        let mut retry_at: Option<i64> = Some(now_ms);
        let mut decisions = Vec::with_capacity(charges.len());
        for (((policy, charge), outcome), seconds) in policies
            .enabled
            .iter()
            .zip(&charges)
            .zip(&evaluation.outcomes)
            .zip(&window_seconds)
        {
            if charge.enforce && !outcome.allowed {
                retry_at = match (retry_at, outcome.retry_at_ms) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
            decisions.push(policy_decision(policy, charge, outcome, *seconds));
        }
        let retry_after_seconds = match evaluation.allowed {
            true => None,
            false => retry_at.map(|at| seconds_until(now_ms, at)),
        };
        Ok(Decision {
            allowed: evaluation.allowed,
            retry_after_seconds,
            degraded: false,
            policies: decisions,
            at: now,
        })
    }
}

/// Whole seconds from `now_ms` until `at_ms`, rounded up (at least 1 when denied).
fn seconds_until(now_ms: i64, at_ms: i64) -> u64 {
    let millis = (at_ms - now_ms).max(1) as u64;
    millis.div_ceil(1_000)
}

fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// The store algorithm for `policy` at `now`, the calendar period (start, Unix seconds) if
/// any, and the window length in seconds.
fn algorithm_for(policy: &Policy, now: DateTime<Utc>) -> (Algorithm, Option<i64>, u64) {
    match policy.spec.window {
        Window::Calendar { period, timezone } => {
            let (start, end) = window::calendar_bounds(period, timezone, now);
            let seconds = (end - start).num_seconds().max(1) as u64;
            let algorithm = Algorithm::Calendar {
                period_end_ms: end.timestamp_millis(),
            };
            (algorithm, Some(start.timestamp()), seconds)
        }
        Window::Rolling {
            seconds,
            bucket_seconds,
        } => {
            let algorithm = Algorithm::Rolling {
                bucket_ms: bucket_seconds as i64 * 1_000,
                buckets: (seconds / bucket_seconds) as i64,
            };
            (algorithm, None, seconds)
        }
        Window::TokenBucket { seconds } => {
            let algorithm = Algorithm::TokenBucket {
                period_ms: seconds as i64 * 1_000,
            };
            (algorithm, None, seconds)
        }
    }
}

fn policy_decision(
    policy: &Policy,
    charge: &Charge,
    outcome: &Outcome,
    window_seconds: u64,
) -> PolicyDecision {
    PolicyDecision {
        policy_id: policy.id.clone(),
        measure: policy.spec.measure,
        mode: policy.spec.mode,
        limit: charge.limit,
        used: outcome.used,
        remaining: charge.limit.saturating_sub(outcome.used),
        resets_at: from_millis(outcome.resets_at_ms),
        allowed: outcome.allowed,
        window_seconds,
    }
}

/// The answer when the counter store is down and the operator chose to fail open.
fn degraded(
    now: DateTime<Utc>,
    policies: &[Arc<Policy>],
    charges: &[Charge],
    window_seconds: &[u64],
) -> Decision {
    let outcomes = charges.iter().map(|_| Outcome {
        used: 0,
        allowed: true,
        resets_at_ms: now.timestamp_millis(),
        retry_at_ms: None,
    });
    Decision {
        allowed: true,
        retry_after_seconds: None,
        degraded: true,
        policies: policies
            .iter()
            .zip(charges)
            .zip(outcomes)
            .zip(window_seconds)
            .map(|(((p, c), o), s)| policy_decision(p, c, &o, *s))
            .collect(),
        at: now,
    }
}
