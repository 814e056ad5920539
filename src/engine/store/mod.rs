//! Counter storage: the one seam between the quota engine and where usage lives.
//!
//! A [`CounterStore`] applies one decision atomically: it reads the usage of every
//! policy involved, decides, and charges all of them or none. The engine has already
//! turned policies into [`Charge`]s (keys, limits, costs, window parameters), so the
//! stores know nothing of time zones or policies, only of three counting algorithms:
//!
//! | [`Algorithm`] | state per key | charged as |
//! |---|---|---|
//! | `Calendar` | one integer per period (the key names the period) | `INCRBY` |
//! | `Rolling` | a hash of bucket index → units | `HINCRBY` on the current bucket |
//! | `TokenBucket` | `used × period_ms` and the time it was computed | GCRA in integers |
//!
//! The same semantics are implemented twice, in Lua for Redis (`scripts/consume.lua`)
//! and in Rust for the in-process store (`memory.rs`); one conformance suite runs both.

pub mod circuit;
#[cfg(test)]
mod conformance;
pub mod memory;
pub mod redis;

use async_trait::async_trait;

/// How long a key outlives the moment its usage would reach zero, in milliseconds.
///
/// The grace covers clock skew between instances: an instance whose clock runs a little
/// behind still finds (and adds to) the same counter instead of a fresh one.
pub const KEY_GRACE_MS: i64 = 60_000;

/// The counting algorithm of one charge, with its window parameters in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// A fixed period ending at `period_end_ms`; the key already names the period.
    Calendar {
        /// End of the current period (exclusive), Unix milliseconds.
        period_end_ms: i64,
    },
    /// A trailing window of `buckets × bucket_ms`, kept as a hash of bucket index → units.
    ///
    /// At time `now`, the current bucket is `floor(now / bucket_ms)`; buckets with index
    /// `>= current - buckets` count (that is `buckets + 1` of them), so a unit stops
    /// counting between W and W + B after it was charged and no trailing W ever holds
    /// more than the limit.
    Rolling {
        /// Bucket length B in milliseconds.
        bucket_ms: i64,
        /// W / B.
        buckets: i64,
    },
    /// Generic cell rate algorithm: `limit` units per `period_ms`, bursts up to `limit`.
    TokenBucket {
        /// The refill period in milliseconds; `limit × period_ms <= 2^53 - 1`.
        period_ms: i64,
    },
}

/// What one policy asks of the store in one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The counter's full key (prefix and hash tag included); see `engine::keys`.
    pub key: String,
    /// How to count.
    pub algorithm: Algorithm,
    /// The most that may be used (the override's limit when one applies).
    pub limit: u64,
    /// Units this decision would charge; 0 to only read usage.
    pub cost: u64,
    /// `false` for shadow policies: they are charged and reported but never deny.
    pub enforce: bool,
}

/// The store's answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Usage after this decision (including `cost` if the decision was applied).
    pub used: u64,
    /// Whether this policy alone would let the charge through (`used_before + cost <= limit`).
    pub allowed: bool,
    /// When usage would be back to zero with no further charges (Unix ms; `now` if already zero).
    pub resets_at_ms: i64,
    /// When the same charge would pass this policy; `None` if it passes now or never can
    /// (`cost > limit`).
    pub retry_at_ms: Option<i64>,
}

/// The store's answer for one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// True when every enforcing charge was allowed; then (if committing) all were applied.
    pub allowed: bool,
    /// One outcome per charge, in the order given.
    pub outcomes: Vec<Outcome>,
}

/// Why a store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is unreachable or timed out; worth retrying, mapped to 503.
    #[error("counter store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something we did not expect: a bug, mapped to 500.
    #[error("counter store answered unexpectedly: {0}")]
    Protocol(String),
}

/// Where counters live. Implementations are atomic per call: all charges or none.
#[async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// Evaluates `charges` at `now_ms`; when `commit` is true and the decision is allowed,
    /// applies every charge. Shadow charges (`enforce == false`) never make it deny.
    ///
    /// All keys of one call belong to one (action, subject) and share a Redis hash tag.
    async fn evaluate(
        &self,
        now_ms: i64,
        charges: &[Charge],
        commit: bool,
    ) -> Result<Evaluation, StoreError>;

    /// Checks that the store answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether calls are being refused without trying (a tripped circuit breaker).
    fn circuit_open(&self) -> bool {
        false
    }
}
