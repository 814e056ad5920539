//! The quota engine: turns a consume into one atomic counter-store call and a [`Decision`].
//!
//! The engine resolves the action's policies from the cache, computes each policy's
//! window parameters from the clock (calendar boundaries in the policy's time zone),
//! builds one [`store::Charge`] per policy, and asks the counter store to apply all or
//! none of them. A denial is a value ([`Decision::allowed`] is false), not an error.
//! Consumes and holds ([`consume`]) also keep idempotency records and ledger entries in
//! that same atomic step; refunds and hold settlement live in [`giveback`].

pub mod clock;
pub mod consume;
pub mod giveback;
pub mod keys;
mod plan;
pub mod store;
pub mod window;

use crate::config::OnStoreError;
use crate::domain::{Action, Measure, Mode, PolicyId, Quantity, Subject};
use crate::ledger::writer::LedgerWriter;
use crate::ledger::{LedgerError, LedgerStore};
use crate::policy::PolicyCache;
use chrono::{DateTime, TimeZone, Utc};
use clock::Clock;
use std::sync::Arc;
use store::{CounterStore, StoreError};

pub use consume::{Consumed, HoldTicket};
pub use giveback::Settled;

/// One request to charge (or check, or hold) `amount` for `subject` doing `action`.
#[derive(Debug, Clone)]
pub struct ConsumeRequest {
    /// What is being done.
    pub action: Action,
    /// Who does it.
    pub subject: Subject,
    /// How much, in minor units (count policies charge 1 regardless).
    pub amount: Quantity,
    /// Makes retries safe: scoped to action + subject.
    pub idempotency_key: Option<String>,
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

/// Why the engine could not decide (or give back).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The action has no policies: never a silent allow.
    #[error("no policy limits the action '{0}'")]
    UnknownAction(Action),
    /// No such consumption or hold.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the state: over-refund, settled hold, reused key.
    #[error("{0}")]
    Conflict(String),
    /// The counter store failed and the configuration says fail closed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger could not be read or written.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Empties the Redis ledger streams into SQL on demand (see `ledger::drain`).
#[async_trait::async_trait]
pub trait DrainNow: Send + Sync {
    /// Moves everything the streams hold into the SQL ledger now.
    async fn drain_now(&self);

    /// How many entries wait in the streams; `None` if Redis did not answer.
    async fn backlog(&self) -> Option<u64>;
}

/// The quota engine; shared by every request.
pub struct Engine {
    counters: Arc<dyn CounterStore>,
    cache: Arc<PolicyCache>,
    clock: Arc<dyn Clock>,
    prefix: String,
    on_store_error: OnStoreError,
    ledger: Arc<dyn LedgerStore>,
    writer: LedgerWriter,
    drain: std::sync::OnceLock<Arc<dyn DrainNow>>,
}

impl Engine {
    /// Builds the engine over its stores.
    pub fn new(
        counters: Arc<dyn CounterStore>,
        cache: Arc<PolicyCache>,
        clock: Arc<dyn Clock>,
        prefix: String,
        on_store_error: OnStoreError,
        ledger: Arc<dyn LedgerStore>,
    ) -> Self {
        Self {
            counters,
            cache,
            clock,
            prefix,
            on_store_error,
            writer: LedgerWriter::spawn(ledger.clone()),
            ledger,
            drain: std::sync::OnceLock::new(),
        }
    }

    /// Writes ledger entries durably (group commit) before the caller answers; used when
    /// the counter store does not stream them (the embedded default), and for degraded allows.
    async fn record(&self, entries: Vec<crate::ledger::LedgerEntry>) -> Result<(), EngineError> {
        self.writer.append(entries).await.map_err(EngineError::from)
    }

    /// Registers the drain that refunds use when a charge is not in SQL yet (Redis mode).
    pub fn set_drain(&self, drain: Arc<dyn DrainNow>) {
        let _ = self.drain.set(drain);
    }

    /// Ledger entries waiting in the Redis streams (`None` without Redis).
    pub async fn ledger_backlog(&self) -> Option<u64> {
        match self.drain.get() {
            Some(drain) => drain.backlog().await,
            None => None,
        }
    }

    /// The counter store (for readiness checks and background tasks).
    pub fn counters(&self) -> &dyn CounterStore {
        self.counters.as_ref()
    }

    /// The Redis key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The current time on the engine's clock, to the millisecond: the precision of every
    /// window computation, answer and ledger entry (and of what Postgres keeps).
    pub fn now(&self) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(self.clock.now(), 3)
    }

    /// Decides `request` without charging (a check). Consumes go through [`Engine::consume`].
    pub async fn check(&self, request: &ConsumeRequest) -> Result<Decision, EngineError> {
        let plan = self.plan(&request.action, &request.subject, request.amount)?;
        if plan.charges.is_empty() {
            return Ok(plan.empty_decision());
        }
        match self
            .counters
            .evaluate(plan.now_ms(), &plan.charges, false)
            .await
        {
            Ok(evaluation) => Ok(plan.decision(&evaluation)),
            Err(error) => self.on_store_failure(&plan, error),
        }
    }

    /// Current usage of every enabled policy of the action for the subject; charges nothing.
    pub async fn usage(&self, action: &Action, subject: &Subject) -> Result<Decision, EngineError> {
        let plan = self.plan(action, subject, Quantity::ZERO)?;
        if plan.charges.is_empty() {
            return Ok(plan.empty_decision());
        }
        let evaluation = self
            .counters
            .evaluate(plan.now_ms(), &plan.charges, false)
            .await?;
        Ok(plan.decision(&evaluation))
    }

    /// The degraded answer when the store is down and the operator chose to fail open.
    fn on_store_failure(
        &self,
        plan: &plan::Plan,
        error: StoreError,
    ) -> Result<Decision, EngineError> {
        match error {
            error if error.is_transient() && self.on_store_error == OnStoreError::Allow => {
                tracing::warn!(error = %error, "counter store unavailable; allowing (degraded)");
                Ok(plan.degraded_decision())
            }
            error => Err(error.into()),
        }
    }
}

/// Whole seconds from `now_ms` until `at_ms`, rounded up (at least 1 when denied).
fn seconds_until(now_ms: i64, at_ms: i64) -> u64 {
    let millis = (at_ms - now_ms).max(1) as u64;
    millis.div_ceil(1_000)
}

/// An instant from Unix milliseconds (the epoch if out of range).
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}
