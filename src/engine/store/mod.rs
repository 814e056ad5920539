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
//! The same semantics are implemented twice, in Lua for Redis (`crate::counters::redis`)
//! and in Rust for the in-process store (`crate::counters::memory`); one conformance
//! suite runs both.

use crate::domain::CounterCharge;
pub(crate) use crate::domain::Restore;
use crate::keys::CounterKey;
use async_trait::async_trait;

mod effects;
pub use effects::{Decided, Effects, Finalize, Finalized, IntentOpen, ReservationOpen};
pub(crate) use effects::{HoldOpen, IdempotencyRecord, LedgerAppend, OnCrossing, TotalsAppend};

/// How long a key outlives the moment its usage would reach zero, in milliseconds.
///
/// The grace covers clock skew between instances: an instance whose clock runs a little
/// behind still finds (and adds to) the same counter instead of a fresh one.
pub(crate) const KEY_GRACE_MS: i64 = 60_000;

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
    /// A calendar period in the zone each request names (`timezone_attribute`): one key per
    /// budget holding `used:start_ms:end_ms`. A period that is running (`now < end`) is
    /// counted in, whatever zone the request claims; otherwise a new one starts at `now`
    /// and ends at `period_end_ms`, the end of the current period in the request's zone.
    ZonedCalendar {
        /// End of the current period in the request's zone, Unix milliseconds.
        period_end_ms: i64,
    },
    /// A per-request maximum: the charge passes when its cost is at most the limit, and
    /// neither reads nor writes its key (its `used` is the cost; nothing accumulates).
    Request,
    /// Usage that never resets: one integer kept with no time to live.
    Lifetime,
}

/// What one policy asks of the store in one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The counter's key, and the shard it lives in; see `crate::keys`.
    pub key: CounterKey,
    /// How to count.
    pub algorithm: Algorithm,
    /// The most that may be used (the override's limit when one applies).
    pub limit: u64,
    /// Units this decision would charge; 0 to only read usage.
    pub cost: u64,
    /// `false` for shadow policies: they are charged and reported but never deny.
    pub enforce: bool,
}

/// One call of the decision script (`consume.lua` on Redis, its twin in process): the
/// charges of one decision and the effects applied with them in the same atomic step.
#[derive(Debug, Clone, Copy)]
pub struct Consume<'a> {
    /// The decision's instant, Unix ms.
    pub(crate) now_ms: i64,
    /// One charge per policy, in the order the answer reports them.
    pub(crate) charges: &'a [Charge],
    /// Apply the charges when the decision is allowed; false only looks (a peek).
    pub(crate) commit: bool,
    /// What is done with the charges besides counting.
    pub(crate) effects: &'a Effects,
}

/// An amount beside signed ones (a give-back below zero charges more): amounts are at
/// most 2^53 - 1, so every one fits.
pub(crate) fn signed(amount: u64) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}

/// A lifetime counter's `resets_at_ms`: it never resets (2^53 - 1, which Lua keeps exactly,
/// is past any time chrono can represent).
pub(crate) const NEVER_MS: i64 = 9_007_199_254_740_991;

/// The store's answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Usage after this decision (including `cost` if the decision was applied).
    pub(crate) used: u64,
    /// Whether this policy alone would let the charge through (`used_before + cost <= limit`).
    pub(crate) allowed: bool,
    /// When usage would be back to zero with no further charges (Unix ms; `now` if already
    /// zero; [`NEVER_MS`] for a lifetime counter).
    pub(crate) resets_at_ms: i64,
    /// When the same charge would pass this policy; `None` if it passes now or never can
    /// (`cost > limit`).
    pub(crate) retry_at_ms: Option<i64>,
}

impl Outcome {
    /// No usage, allowed: what a charge that was not looked at reports.
    pub(crate) fn empty(now_ms: i64) -> Self {
        Self {
            used: 0,
            allowed: true,
            resets_at_ms: now_ms,
            retry_at_ms: None,
        }
    }
}

/// The store's answer for one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// True when every enforcing charge was allowed; then (if committing) all were applied.
    pub(crate) allowed: bool,
    /// One outcome per charge, in the order given.
    pub(crate) outcomes: Vec<Outcome>,
}

/// What is being given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveBackKind {
    /// A refund of `amount` out of a charge of `total`; `refunded` is what the ledger knows
    /// was refunded already (used when the store's own running total has expired).
    Refund {
        /// Units to refund now.
        amount: u64,
        /// The original charge.
        total: u64,
        /// Refunded before, per the ledger.
        refunded: u64,
    },
    /// Settle `settle` of a hold of `total`; the rest goes back. Refused once expired.
    Commit {
        /// Units to keep.
        settle: u64,
        /// The held amount.
        total: u64,
        /// The hold's expiry.
        expires_at_ms: i64,
    },
    /// Give a whole hold back on request. Refused once expired.
    Release {
        /// The held amount.
        total: u64,
        /// The hold's expiry.
        expires_at_ms: i64,
    },
    /// Give a whole hold back because it expired at `expires_at_ms` (only if still open).
    Expire {
        /// The held amount.
        total: u64,
        /// Its expiry.
        expires_at_ms: i64,
    },
    /// Void a charge whose request was answered 503 but which Redis decided all the same
    /// (`engine::recovery::void`): give it all back, once (the control key is the marker), unless a
    /// retry was answered with its outcome (the idempotency "record" names the marker the
    /// replay leaves); its idempotency record (the key) is deleted.
    Void {
        /// The charged amount.
        total: u64,
    },
    /// Void a hold likewise: like a release (the control key is its record), but marked
    /// `voided`.
    VoidHold {
        /// The held amount.
        total: u64,
        /// The hold's expiry.
        expires_at_ms: i64,
    },
    /// Redis Cluster: abandon a consume's intent (the control key) at home, giving its home
    /// charges back once, unless it committed (a conflict, `committed`).
    Abandon,
    /// Redis Cluster: undo a consume's reservation (the control key) in a foreign slot,
    /// once; a missing one becomes a tombstone, so that a late reservation is refused.
    Undo,
    /// Redis Cluster: the attempt is resolved; drop it from the index of intents.
    Resolved,
    /// Redis Cluster: give a refund's or settlement's units back to a foreign slot's
    /// counters once (the control key is the marker): count policies their charge when
    /// `full`, amount policies `by_amount`.
    RestoreOnce {
        /// Count policies get their charge back.
        full: bool,
        /// What amount policies get back; below zero, what they are charged more (the
        /// excess of an over-captured commit).
        by_amount: i64,
    },
}

/// A refund or the settlement of a hold, applied atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiveBack {
    /// What happens.
    pub(crate) kind: GiveBackKind,
    /// Refund: the running refunded total's key. Hold: the hold's record key.
    pub(crate) control_key: String,
    /// Hold: the shard's index of open holds and the hold id.
    pub(crate) hold_index: Option<(String, String)>,
    /// The counters the charge went to.
    pub(crate) counters: Vec<CounterCharge>,
    /// The ledger entry to append on success (Redis).
    pub(crate) ledger: Option<(String, String)>,
    /// For refunds with an idempotency key: the record to keep (and replay).
    pub(crate) idempotency: Option<IdempotencyRecord>,
    /// Redis Cluster: the share of other slots still to give back, kept at home with the
    /// give-back, so that a crash before it is given is redone by the sweeper.
    pub(crate) pending: Option<IntentOpen>,
    /// Whether the store reports each counter's usage before and after (a policy alerts):
    /// [`GivenBack::Done`]'s `usage`, which a streamed entry (ending with the start of its
    /// kept answer) gets appended.
    pub(crate) reports_usage: bool,
}

/// The store's answer to a [`GiveBack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GivenBack {
    /// Applied; for refunds, the refunded total after it.
    Done {
        /// Refunded so far (refunds), or 0.
        refunded: u64,
        /// The in-process store: what each counter got back, in its own units (a token
        /// bucket's in unit-milliseconds), which may be less than asked of a counter that
        /// held less; below zero, what it was charged more (an over-capture's excess); what
        /// undoing it puts back. Empty from Redis.
        restored: Vec<i64>,
        /// When [`GiveBack::reports_usage`]: each counter's usage before and after, as
        /// `before,after` joined by `;` (`0,0` for one it did not change); else empty.
        usage: String,
    },
    /// Refused: over-refund, or a hold no longer open. The text says which.
    Conflict(String),
    /// The hold record is unknown (never existed, or long gone).
    Unknown,
    /// The idempotency key was used before: its record.
    Replayed(String),
}

/// What a change applied to a store that does not stream the ledger (the in-process
/// store) takes to undo, when its ledger entry could not be committed: the engine's unit
/// of work (`engine::unit`) makes a change visible for good only with its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// A decision that charged: its counters get what it charged back, and its kept
    /// answer and hold (record and index entry) are forgotten.
    Charge {
        /// What the decision put on each counter.
        counters: Vec<CounterCharge>,
        /// Its idempotency record's key, if any.
        idempotency: Option<String>,
        /// Its hold: the record's key, and the shard's index with the hold id.
        hold: Option<(String, (String, String))>,
    },
    /// A give-back that was applied (`refunded`: the refunded total it answered): its
    /// counters are charged again with what they got, its refunded total or hold record
    /// is put back as it was, and its kept answer is forgotten.
    GiveBack {
        /// The give-back as it was applied.
        request: Box<GiveBack>,
        /// [`GivenBack::Done`]'s refunded total.
        refunded: u64,
        /// [`GivenBack::Done`]'s restored units, per counter.
        restored: Vec<i64>,
    },
}

/// Decisions sent to a store server, and the calls that carried them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecisionCalls {
    /// Decisions sent (each once, alone or in a batch).
    pub decisions: u64,
    /// Script calls that carried them.
    pub calls: u64,
}

/// Why a store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is unreachable (refused, reset, circuit open); worth retrying, mapped to 503.
    #[error("counter store unavailable: {0}")]
    Unavailable(String),
    /// No connection to the store could be made within the deadline (refused, or no
    /// answer to the handshake); worth retrying, mapped to 503.
    #[error("counter store not reachable: {0}")]
    NotConnected(String),
    /// The store is set up so that it may lose what it keeps (Redis with an evicting
    /// `maxmemory-policy`); an operator must fix it, retrying cannot help (503, never
    /// a degraded allow).
    #[error("{0}")]
    Misconfigured(String),
    /// The store decided and charged, but fewer replicas than `QUOTA_REDIS_MIN_REPLICAS`
    /// acknowledged it in time: answered 503 and voided as any attempt in doubt, never a
    /// degraded allow (the store is not down).
    #[error("counter store change not replicated: {0}")]
    Unreplicated(String),
    /// The store did not answer in time; worth retrying, mapped to 503. The call may still
    /// have been applied: it over-counts, never over-allows.
    #[error("counter store timed out: {0}")]
    Timeout(String),
    /// The store answered something we did not expect: a bug, mapped to 500.
    #[error("counter store answered unexpectedly: {0}")]
    Protocol(String),
    /// The shard's state is not (or no longer) the ledger's: Redis lost its data, or was
    /// never rebuilt. Nothing was decided; a rebuild is under way. Worth retrying (503, or a
    /// degraded allow under `QUOTA_ON_STORE_ERROR=allow`).
    #[error("counter store shard {shard} is being rebuilt from the ledger")]
    Rebuilding {
        /// The shard.
        shard: u16,
    },
}

impl StoreError {
    /// Whether retrying later may succeed (unreachable or timed out), as opposed to a bug.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::NotConnected(_)
                | Self::Timeout(_)
                | Self::Rebuilding { .. }
        )
    }

    /// Whether the store ran out of time (a call, or connecting) rather than refusing:
    /// while this instance sheds load, such a failure is most likely its own saturation.
    pub fn is_late(&self) -> bool {
        matches!(self, Self::NotConnected(_) | Self::Timeout(_))
    }
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

    /// Like [`CounterStore::evaluate`], with the [`Effects`] of a consume in the same atomic step.
    async fn decide(&self, call: &Consume<'_>) -> Result<Decided, StoreError>;

    /// Gives units back (refund, hold settlement), atomically with its bookkeeping.
    async fn give_back(&self, now_ms: i64, request: &GiveBack) -> Result<GivenBack, StoreError>;

    /// Up to `limit` hold ids of `index_key` whose expiry is at or before `now_ms`.
    async fn expired_holds(
        &self,
        index_key: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// The expiry of the hold of `index_key` that expires first, if any (in ms).
    async fn next_due(&self, index_key: &str) -> Result<Option<i64>, StoreError>;

    /// Takes the lease `key` for `owner` for `ttl_ms`, or extends it when `owner` holds it
    /// already; false while another owner holds it. A store private to one process has
    /// one instance: the default always grants it.
    async fn lease(&self, _key: &str, _owner: &str, _ttl_ms: u64) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Gives the lease `key` up if `owner` holds it.
    async fn release(&self, _key: &str, _owner: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// The text record kept at `record_key` at `now_ms`, if any: a hold, a refunded total.
    async fn record(&self, record_key: &str, now_ms: i64) -> Result<Option<String>, StoreError>;

    /// Now on the store's clock as this instance measures it, Unix ms: the clock the store
    /// stamps its stream entries and checks call deadlines by (Redis's `TIME`, through the
    /// offset measured every second). This machine's wall clock for a store without one.
    fn store_now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The longest a call may take before its caller stops waiting (Redis: the call's
    /// deadline is its send time plus this); zero for a store whose calls cannot time out.
    fn call_timeout(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The cross-slot protocol of a store whose calls reach one slot each (a Redis
    /// Cluster, `engine::crossslot`); `None` for a store whose calls may touch keys of
    /// several hash tags (shards) and stay atomic: the in-process store, a standalone Redis.
    fn across_slots(&self) -> Option<&dyn AcrossSlots> {
        None
    }

    /// Whether one call may touch keys of several hash tags (shards) and still be atomic
    /// (no [`CounterStore::across_slots`]).
    fn atomic_across_tags(&self) -> bool {
        self.across_slots().is_none()
    }

    /// Checks that the store answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether calls are being refused without trying (a tripped circuit breaker).
    fn circuit_open(&self) -> bool {
        false
    }

    /// Decisions sent to a store server and the script calls that carried them, since the
    /// start (Redis batches decisions per round trip); `None` for the in-process store.
    fn decision_calls(&self) -> Option<DecisionCalls> {
        None
    }

    /// The memory of a store that keeps its data in a server with a bound of its own
    /// (Redis), for `/metrics`; `None` for the in-process store, or when it did not answer.
    /// Redis's adapter also judges the eviction policy it read: an unsafe one refuses
    /// every decision from then on, a fixed one serves again. The engine looks every
    /// [`MEMORY_LOOK_EVERY`](super::pipeline::backlog::MEMORY_LOOK_EVERY).
    async fn memory(&self) -> Option<StoreMemory> {
        None
    }
}

/// What a store whose calls reach one slot each (a Redis Cluster) does beside deciding:
/// a consume across slots reserves in each slot, then commits at home.
#[async_trait]
pub trait AcrossSlots: Send + Sync {
    /// Commits a consume across Redis Cluster slots at home (`engine::crossslot`).
    async fn finalize(&self, now_ms: i64, request: &Finalize) -> Result<Finalized, StoreError>;
}

/// What a store that does not stream the ledger (the in-process one) does beside
/// deciding: a change it applied stands for good only once its entry is committed
/// (`engine::pipeline::unit`). A store that streams the ledger appends the entry in the
/// same atomic step, and has nothing to undo.
pub trait Undoable: Send + Sync + 'static {
    /// Undoes a change whose ledger entry could not be committed (see [`Undo`]);
    /// synchronous so that it can run when a cancelled request's work is dropped.
    fn undo(&self, now_ms: i64, undo: &Undo) -> Result<(), StoreError>;

    /// Confirms a change whose ledger entry was committed: what it kept as in flight
    /// ([`IdempotencyRecord::pending`]) is kept for good; synchronous, like
    /// [`Undoable::undo`].
    fn confirm(&self, now_ms: i64, change: &Undo);
}

/// A counter store's memory, as its servers report it (every node of a cluster, summed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreMemory {
    /// Bytes in use.
    pub used_bytes: u64,
    /// The configured bound (`maxmemory`), in bytes; 0 when a node has none.
    pub max_bytes: u64,
    /// The `maxmemory-policy` of each node, deduplicated (`noeviction` is the only safe one).
    pub policies: Vec<String>,
}

/// The largest quantity (limit, cost, usage) a store accepts or reports: 2^53 - 1.
pub(crate) const MAX_UNITS: u64 = (1 << 53) - 1;

/// The largest magnitude of a time (`now_ms`, a period end) the stores accept: 2^51 ms, about
/// 71,000 years, so that sums of times and windows stay exact in Lua's doubles.
pub(crate) const MAX_TIME_MS: i64 = 1 << 51;

/// Rejects arguments outside what both stores compute exactly; both backends call it first,
/// so they fail identically. Such arguments are the caller's bug, hence `Protocol`.
///
/// Checked: quantities within 2^53 - 1, times within ±2^51 ms, positive window parameters,
/// `limit × period_ms <= 2^53 - 1` for token buckets, `buckets × bucket_ms <= 2^51` for
/// rolling windows, distinct keys and, unless the store decides `across` hash tags
/// atomically, one hash tag for all keys (one cluster slot, one shard).
pub(crate) fn check_charges(
    now_ms: i64,
    charges: &[Charge],
    across: bool,
) -> Result<(), StoreError> {
    let invalid =
        |i: usize, what: &str| StoreError::Protocol(format!("invalid charge {i}: {what}"));
    if now_ms.unsigned_abs() > MAX_TIME_MS.unsigned_abs() {
        return Err(StoreError::Protocol(format!(
            "time {now_ms} ms is out of range"
        )));
    }
    let tag = charges
        .first()
        .map(|c| crate::keys::hash_tag(c.key.as_str()));
    for (i, charge) in charges.iter().enumerate() {
        if charge.limit > MAX_UNITS || charge.cost > MAX_UNITS {
            return Err(invalid(i, "limit and cost must be at most 2^53 - 1"));
        }
        let window_ok = match charge.algorithm {
            Algorithm::Calendar { period_end_ms } | Algorithm::ZonedCalendar { period_end_ms } => {
                period_end_ms.unsigned_abs() <= MAX_TIME_MS.unsigned_abs()
            }
            Algorithm::Rolling { bucket_ms, buckets } => {
                bucket_ms > 0
                    && buckets > 0
                    && bucket_ms
                        .checked_mul(buckets)
                        .is_some_and(|w| w <= MAX_TIME_MS)
            }
            Algorithm::TokenBucket { period_ms } => {
                period_ms > 0
                    && u64::try_from(period_ms)
                        .ok()
                        .and_then(|p| p.checked_mul(charge.limit.max(1)))
                        .is_some_and(|product| product <= MAX_UNITS)
            }
            Algorithm::Request | Algorithm::Lifetime => true,
        };
        if !window_ok {
            return Err(invalid(i, "window parameters out of range"));
        }
        if !across && tag != Some(crate::keys::hash_tag(charge.key.as_str())) {
            return Err(invalid(i, "all keys of one decision must share a hash tag"));
        }
        if charges[..i].iter().any(|other| other.key == charge.key) {
            return Err(invalid(i, "the same key appears twice"));
        }
    }
    Ok(())
}
