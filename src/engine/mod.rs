//! The quota engine: turns a consume into one atomic counter-store call and a [`Decision`].
//!
//! The engine resolves the action's policies from the cache, computes each policy's
//! window parameters from the clock (calendar boundaries in the policy's time zone),
//! builds one [`store::Charge`] per policy, and asks the counter store to apply all or
//! none of them. A denial is a value ([`Decision::allowed`] is false), not an error.
//! Consumes and holds ([`consume`]) also keep idempotency records and ledger entries in
//! that same atomic step; refunds and hold settlement live in [`giveback`].

pub mod alerts;
pub mod codec;
pub mod decision;
pub(crate) mod deployment;
pub mod faults;
pub(crate) mod followup;
pub mod janitor;
pub mod ledger;
pub mod load;
pub mod pipeline;
pub mod recovery;
pub(crate) mod shards;
pub(crate) mod state;
pub mod store;

use crate::clock::Clock;
use crate::domain::{
    Action, Attributes, Budget, FieldErrors, IdempotencyKey, Measure, Mode, PolicyId, Quantity,
    Subject,
};
use chrono::{DateTime, TimeZone, Utc};
use decision::policies::PolicyCache;
use deployment::Durability;
use ledger::{LedgerError, LedgerStore};
use pipeline::writer::LedgerWriter;
use std::sync::Arc;
use store::{CounterStore, StoreError};

pub(crate) use decision::consume::Consumed;
pub(crate) use decision::giveback::Settled;
pub use recovery::snapshot::{Restored, Saved};

/// One request to charge (or check, or hold) `amount` for `subject` doing `action`.
#[derive(Debug, Clone)]
pub(crate) struct ConsumeRequest {
    /// What is being done.
    pub(crate) action: Action,
    /// Who does it.
    pub(crate) subject: Subject,
    /// How much, in minor units (count policies charge 1 regardless).
    pub(crate) amount: Quantity,
    /// Makes retries safe: scoped to action + subject.
    pub(crate) idempotency_key: Option<IdempotencyKey>,
    /// What the policies' scopes and `match` conditions read.
    pub(crate) attributes: Attributes,
    /// No subject was given (a gateway descriptor without a `subject` entry): `subject`
    /// then only names the request in the ledger, and a policy whose scope names the
    /// subject cannot apply (the request is invalid).
    pub(crate) anonymous: bool,
}

/// One policy's part of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyDecision {
    /// The policy this part of the answer is about.
    pub(crate) policy_id: PolicyId,
    /// Count or amount.
    pub(crate) measure: Measure,
    /// Enforce or shadow.
    pub(crate) mode: Mode,
    /// The limit that applied (an override's, if any).
    pub(crate) limit: u64,
    /// Usage after this decision.
    pub(crate) used: u64,
    /// `limit - used`, never below zero.
    pub(crate) remaining: u64,
    /// When usage would be back to zero with no further consumption; `None` for never (a
    /// lifetime window).
    pub(crate) resets_at: Option<DateTime<Utc>>,
    /// Whether this policy alone would allow the request.
    pub(crate) allowed: bool,
    /// The window's length in seconds (for the `RateLimit-Policy` header).
    pub(crate) window_seconds: u64,
    /// The budget the request falls in under this policy.
    pub(crate) budget: Budget,
}

/// The answer to a consume or check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Whether the request is (or would be) allowed.
    pub(crate) allowed: bool,
    /// Seconds until the same request would pass; `None` if allowed or if it never can.
    pub(crate) retry_after_seconds: Option<u64>,
    /// True when the counter store was down and `QUOTA_ON_STORE_ERROR=allow` let it through.
    pub(crate) degraded: bool,
    /// One entry per enabled policy, ordered by policy id.
    pub(crate) policies: Vec<PolicyDecision>,
    /// When the decision was made.
    pub(crate) at: DateTime<Utc>,
}

/// Why the engine could not decide (or give back).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EngineError {
    /// The action has no policies: never a silent allow.
    #[error("no policy limits the action '{0}'")]
    UnknownAction(Action),
    /// The request lacks what a policy that applies needs (an attribute its scope names).
    #[error("{0}")]
    Invalid(FieldErrors),
    /// No such consumption or hold.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the state: over-refund, settled hold, reused key.
    #[error("{0}")]
    Conflict(String),
    /// A counter-store call timed out while this instance was shedding load: our own
    /// saturation, answered as overload (never a degraded allow).
    #[error("the service is overloaded; retry shortly")]
    Overloaded,
    /// `max` ledger entries or more wait in the Redis streams: nothing may be charged
    /// until the drain has moved some into SQL (never a degraded allow).
    #[error("the ledger backlog is full ({max} entries)")]
    BacklogFull {
        /// The bound (`QUOTA_LEDGER_BACKLOG_MAX`).
        max: u64,
    },
    /// The counter store failed and the configuration says fail closed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger could not be read or written.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// An invariant of a unit of work does not hold (`decision::invariants`): a bug. The
    /// unit stopped before the store was called; nothing changed.
    #[error("an invariant does not hold: {0}")]
    Broken(String),
}

/// What to do with a consume when the counter store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// Answer 503 (fail closed): the default, right for money.
    #[default]
    Deny,
    /// Answer allowed with `degraded: true` (fail open).
    Allow,
}

/// The adapters the engine works through, wired by `startup`.
pub(crate) struct Ports {
    /// Where counters live (in-process, or Redis).
    pub(crate) counters: Arc<dyn CounterStore>,
    /// The durable ledger (SQL): read by refunds and holds.
    pub(crate) ledger: Arc<dyn LedgerStore>,
    /// Writes entries to the ledger before the answer when the counter store does not
    /// stream them (the embedded default), and for degraded allows.
    pub(crate) writer: LedgerWriter,
    /// The policies, in memory.
    pub(crate) cache: Arc<PolicyCache>,
    /// The time source.
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether admission control is shedding load (a timeout is then ours, not Redis's).
    pub(crate) load: Arc<load::Load>,
    /// In process or on Redis, with what each needs beside the counter store.
    pub(crate) durability: Arc<dyn Durability>,
    /// A fresh in-process store to replay the ledger into (a shard's on Redis; all of it to verify).
    pub(crate) scratch: state::ScratchStore,
    /// Whether this instance sweeps after dead ones.
    pub(crate) janitor: Arc<janitor::Janitor>,
}

/// What readiness checks report of the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// Whether the counter store answers; `None` in process, where it always does.
    pub(crate) store: Option<bool>,
    /// Whether the ledger backlog waiting in Redis is full; `None` in process.
    pub(crate) backlog_full: Option<bool>,
    /// Why this instance would answer consumes `503` now, each reason a sentence; empty
    /// when it would not (a store down under `QUOTA_ON_STORE_ERROR=allow` answers
    /// degraded, so it is no reason).
    pub(crate) reasons: Vec<String>,
}

/// The quota engine; shared by every request.
pub struct Engine {
    /// The decision path.
    decider: Arc<decision::Decider>,
    /// Where a decided change becomes a committed entry, as the deployment does it.
    pipeline: Arc<pipeline::Pipeline>,
    /// The counters rebuilt from and compared with the ledger; doubts voided.
    recovery: Arc<recovery::Recovery>,
    counters: Arc<dyn CounterStore>,
    cache: Arc<PolicyCache>,
    clock: Arc<dyn Clock>,
    ledger: Arc<dyn LedgerStore>,
    janitor: Arc<janitor::Janitor>,
    /// The failpoints tests arm (shared with the drain).
    faults: Arc<faults::Faults>,
}

impl Engine {
    /// Builds the engine over its ports; `prefix` starts every counter-store key. The
    /// composition: the pipeline, handed to the decision path with recovery's followups
    /// as its `Followup` port; both handed to recovery.
    pub(crate) fn new(ports: Ports, prefix: String, on_store_error: OnStoreError) -> Self {
        let Ports {
            counters,
            ledger,
            writer,
            cache,
            clock,
            load,
            durability,
            scratch,
            janitor,
        } = ports;
        let faults = durability.faults();
        let pipeline = Arc::new(pipeline::Pipeline::new(durability, writer));
        let followups = Arc::new(recovery::Followups::new(counters.clone()));
        let decider = Arc::new(decision::Decider::new(decision::DeciderPorts {
            counters: counters.clone(),
            cache: cache.clone(),
            clock: clock.clone(),
            prefix: prefix.clone(),
            on_store_error,
            ledger: ledger.clone(),
            load,
            pipeline: pipeline.clone(),
            followup: followups.clone(),
            faults: faults.clone(),
        }));
        let recovery = Arc::new(recovery::Recovery::new(recovery::RecoveryPorts {
            decider: decider.clone(),
            pipeline: pipeline.clone(),
            followups,
            counters: counters.clone(),
            cache: cache.clone(),
            clock: clock.clone(),
            prefix,
            ledger: ledger.clone(),
            scratch,
            janitor: janitor.clone(),
            faults: faults.clone(),
        }));
        Self {
            decider,
            pipeline,
            recovery,
            counters,
            cache,
            clock,
            ledger,
            janitor,
            faults,
        }
    }

    /// The decision path: consumes, checks, holds and what gives quota back.
    pub(crate) fn decider(&self) -> &decision::Decider {
        &self.decider
    }

    /// Recovery: rebuilds, verifies, backtests, voids.
    pub(crate) fn recovery(&self) -> &recovery::Recovery {
        &self.recovery
    }

    /// Voids every attempt in doubt settled by now (`all`: every one, waiting until it
    /// settles); what each found (`recovery::void`). One whose void fails is tried again
    /// in the background.
    pub async fn void_settled(&self, all: bool) -> Vec<recovery::void::Voided> {
        self.recovery.void_settled(all).await
    }

    /// Releases every expired hold of every shard; returns how many.
    pub async fn expire_due_holds(&self) -> usize {
        self.decider.expire_due_holds().await
    }

    /// The failpoints of this engine and its drain, for tests (`engine::faults`).
    pub fn faults(&self) -> &faults::Faults {
        &self.faults
    }

    /// Whether this instance sweeps after dead ones, and its lease.
    pub fn janitor(&self) -> &Arc<janitor::Janitor> {
        &self.janitor
    }

    /// Moves everything the Redis ledger streams hold into SQL now; 0 without Redis.
    pub async fn drain_ledger_now(&self) -> usize {
        self.pipeline.durability().drain_now().await
    }

    /// Counts the ledger entries waiting in the Redis streams now, and bounds consumes by
    /// it (`None` without Redis, or when Redis did not answer). Runs every
    /// [`pipeline::backlog::MEASURE_EVERY`] in the background; tests call it to measure at once.
    pub async fn measure_backlog(&self) -> Option<u64> {
        self.pipeline.durability().measure_backlog().await
    }

    /// The bound of the ledger backlog (`None` without Redis).
    pub(crate) fn backlog_max(&self) -> Option<u64> {
        self.pipeline.durability().backlog_max()
    }

    /// Whether the counter store answers, and whether the ledger backlog is full.
    pub(crate) async fn readiness(&self) -> Readiness {
        self.pipeline.durability().readiness(&self.recovery).await
    }

    /// Starts the deployment's background work (voids, the backlog watch, checkpoints
    /// `checkpoint_every` so often, on Redis).
    pub(crate) async fn start_watches(
        &self,
        checkpoint_every: Option<std::time::Duration>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        self.pipeline
            .durability()
            .start_watches(&self.recovery, checkpoint_every)
            .await
    }

    /// Closes every shard and rebuilds them from the ledger: `quota-ledger counters
    /// rebuild` (Redis only: in process, every start rebuilds the counters). With
    /// `action`, only that action's counters, holds, kept answers and refunded totals.
    pub async fn rebuild_counters(
        &self,
        action: Option<&Action>,
    ) -> anyhow::Result<recovery::shards::Reopened> {
        self.pipeline
            .durability()
            .rebuild(&self.recovery, action)
            .await
    }

    /// Checkpoints every entry committed so far (tests, and an operator's rebuild); `None`
    /// when nothing is new, or the counters are in process.
    pub async fn checkpoint_now(&self) -> anyhow::Result<Option<Saved>> {
        self.pipeline
            .durability()
            .checkpoint_now(&self.recovery)
            .await
    }

    /// Snapshots the in-process store (the embedded default), replacing the snapshot kept;
    /// what was saved, `None` without an in-process store (see `recovery::snapshot`).
    pub async fn snapshot_now(&self) -> Option<Saved> {
        self.pipeline
            .durability()
            .snapshot(&self.recovery, None)
            .await
    }

    /// [`Engine::snapshot_now`], unless the ledger's last entry is still the one numbered
    /// `covered` (the snapshot kept covers it: the state it holds is the same).
    pub async fn snapshot_unless_covered(&self, covered: Option<i64>) -> Option<Saved> {
        self.pipeline
            .durability()
            .snapshot(&self.recovery, covered)
            .await
    }

    /// How many ledger entries were committed after the one numbered `covered` (seqs
    /// may skip numbers, so at most that many); `None` without an in-process store or
    /// when the ledger does not answer.
    pub async fn entries_after(&self, covered: i64) -> Option<u64> {
        self.pipeline.durability().entries_after(covered).await
    }

    /// The durable ledger (the ledger query API reads it).
    pub(crate) fn ledger(&self) -> &dyn LedgerStore {
        self.ledger.as_ref()
    }

    /// The in-process policies the engine decides with (metrics label by them; policy
    /// writes reload them).
    pub(crate) fn policies(&self) -> &PolicyCache {
        &self.cache
    }

    /// The counter store (for readiness checks and background tasks).
    pub(crate) fn counters(&self) -> &dyn CounterStore {
        self.counters.as_ref()
    }

    /// The current time on the engine's clock, to the millisecond: the precision of every
    /// window computation, answer and ledger entry (and of what Postgres keeps).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(self.clock.now(), 3)
    }
}

/// Whole seconds from `now_ms` until `at_ms`, rounded up (at least 1 when denied).
fn seconds_until(now_ms: i64, at_ms: i64) -> u64 {
    let millis = (at_ms - now_ms).max(1) as u64;
    millis.div_ceil(1_000)
}

/// An instant from Unix milliseconds (the epoch if out of range).
/// When a counter that reports `resets_at_ms` resets: `None` for never (a lifetime counter).
pub(crate) fn reset_time(resets_at_ms: i64) -> Option<DateTime<Utc>> {
    (resets_at_ms != store::NEVER_MS).then(|| from_millis(resets_at_ms))
}

pub(crate) fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}
