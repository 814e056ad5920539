//! How this instance makes its counters durable, chosen once in `startup`: one trait,
//! [`Durability`], and its two implementations, the only code that knows the deployments
//! apart. The embedded default ([`Embedded`]) commits each change's entries through the
//! group-commit writer before the answer, undoing the change when they cannot be, and
//! snapshots its store; on Redis ([`Streamed`]) each script appends its change's entries
//! to a ledger stream in the same atomic step, a drain moves them into SQL, the backlog
//! bounds what waits, and shards lost by Redis are rebuilt from the ledger, from the last
//! checkpoint. The rest of the engine calls what it needs done; it never asks which.

mod embedded;
mod streamed;

pub(crate) use embedded::Embedded;
pub(crate) use streamed::Streamed;

use super::faults::Faults;
use super::janitor::Janitor;
use super::pipeline::writer::LedgerWriter;
use super::recovery::shards::Reopened;
use super::recovery::snapshot::Saved;
use super::recovery::verify::{KnownByKey, Learn, Verified, VerifyError};
use super::recovery::Recovery;
use super::store::{StoreError, Undo};
use super::{EngineError, Readiness};
use crate::domain::{Action, KeptAnswer, LedgerEntry};
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A change already applied to the counter store, whose entries are to be recorded.
pub(crate) struct Change<'a> {
    /// Its ledger entries.
    pub(crate) entries: Vec<LedgerEntry>,
    /// When it was applied.
    pub(crate) now_ms: i64,
    /// The answer the last entry keeps (for a retry with the same key), when it keeps one.
    pub(crate) answer: Option<&'a (dyn Fn() -> Option<KeptAnswer> + Sync)>,
    /// What takes the change back.
    pub(crate) undo: &'a (dyn Fn() -> Undo + Sync),
}

/// What a deployment does that the other does not, or does otherwise.
#[async_trait]
pub(crate) trait Durability: Send + Sync {
    /// Whether a consume may charge now (not while the ledger backlog is full).
    fn admit(&self) -> Result<(), EngineError>;

    /// Counts a decided consume's stream entry, if it `appended` one.
    fn appended(&self, appended: bool);

    /// The stream a change of `shard` appends its entries to, in the script's atomic step;
    /// `None` where this instance commits them itself.
    fn ledger_stream(&self, shard: u16) -> Option<String>;

    /// Whether a kept answer waits as in flight until its entry is committed (where the
    /// entry commits after the change).
    fn answers_wait_for_commit(&self) -> bool;

    /// Records `change`; if it cannot be recorded, takes it back and answers the error.
    async fn commit_or_undo(
        &self,
        writer: &LedgerWriter,
        change: Change<'_>,
    ) -> Result<(), EngineError>;

    /// Records the entries of a denial, which changed nothing.
    async fn record_denied(
        &self,
        writer: &LedgerWriter,
        entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError>;

    /// Records at once that `shards` were written to, so that a Redis node that comes
    /// back without the write is caught.
    async fn raise_floors_now(&self, shards: &[u16]) -> Result<(), StoreError>;

    /// Moves what waits outside SQL into it now; false when nothing can wait (every entry
    /// is in SQL before its answer).
    async fn settle_streams(&self) -> Result<bool, EngineError>;

    /// Drains until every entry the streams of `shards` held is in SQL (bounded); false if
    /// they are not by then.
    async fn drain_shards(&self, shards: &BTreeSet<u16>) -> bool;

    /// Whether the entry `id` is in `stream` within `window` (ms): a call answered 503
    /// may then have been applied.
    async fn in_stream(
        &self,
        stream: &str,
        window: (i64, i64),
        id: &str,
    ) -> Result<bool, StoreError>;

    /// The failpoints of this deployment (shared with its drain).
    fn faults(&self) -> Arc<Faults>;

    /// Moves everything waiting outside SQL into it now; how many entries moved.
    async fn drain_now(&self) -> usize;

    /// Counts the ledger entries waiting outside SQL now (`None` where none can wait, or
    /// when the count failed).
    async fn measure_backlog(&self) -> Option<u64>;

    /// The bound of the ledger backlog (`QUOTA_LEDGER_BACKLOG_MAX`), where there is one.
    fn backlog_max(&self) -> Option<u64>;

    /// Why `engine` would answer consumes 503 now, and what is known of its store.
    async fn readiness(&self, recovery: &Recovery) -> Readiness;

    /// Starts moving entries into SQL, if this deployment does (before the first request).
    async fn start_drain(&self, janitor: &Arc<Janitor>) -> Option<JoinHandle<()>>;

    /// Starts the deployment's background work for `engine`: voids, the backlog watch,
    /// checkpoints `checkpoint_every` so often.
    async fn start_watches(
        &self,
        recovery: &Arc<Recovery>,
        checkpoint_every: Option<Duration>,
    ) -> Vec<JoinHandle<()>>;

    /// Rebuilds the counters that lost their state from the ledger (with `action`, from
    /// that action's entries only); nothing to do where every start rebuilds them.
    async fn reopen(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
    ) -> Result<Reopened, EngineError>;

    /// Closes every counter and rebuilds it from the ledger (`counters rebuild`).
    async fn rebuild(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
    ) -> anyhow::Result<Reopened>;

    /// Checkpoints the ledger's replay up to its last entry now.
    async fn checkpoint_now(&self, recovery: &Recovery) -> anyhow::Result<Option<Saved>>;

    /// Snapshots the counters, unless the ledger's last entry is still the one numbered
    /// `covered`; `None` where there is nothing to snapshot.
    async fn snapshot(&self, recovery: &Recovery, covered: Option<i64>) -> Option<Saved>;

    /// How many ledger entries were committed after the one numbered `covered`, where
    /// snapshots count them.
    async fn entries_after(&self, covered: i64) -> Option<u64>;

    /// Compares every live budget (of `action`, or all) with the ledger's usage.
    async fn verify(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Verified, VerifyError>;
}
