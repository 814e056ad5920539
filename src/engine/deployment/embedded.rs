//! The embedded default: the in-process store, whose changes this instance records
//! through the group-commit writer before the answer, undone when they cannot be, and
//! whose state snapshots bound what a start replays.
//!
//! The store applies a change at once, so concurrent decisions count it while its entry
//! commits: they may be denied by a change that is then undone (never allowed past a
//! limit). Its kept answer waits as in flight until the entry is committed: a retry with
//! the same idempotency key meanwhile waits for the outcome (a replay once committed, a
//! fresh decision once undone), never replayed an answer that may yet be undone. The undo
//! is a [`Rollback`] handed to the writer with the entries, so it runs even when the
//! request is cancelled while it waits.

use super::{Change, Durability};
use crate::domain::{Action, LedgerEntry};
use crate::engine::faults::Faults;
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerError;
use crate::engine::pipeline::writer::{LedgerWriter, Rollback};
use crate::engine::recovery::shards::Reopened;
use crate::engine::recovery::snapshot::{Saved, Snapshots};
use crate::engine::recovery::verify::{KnownByKey, Learn, Verified, VerifyError};
use crate::engine::recovery::Recovery;
use crate::engine::store::{StoreError, Undoable};
use crate::engine::{EngineError, Readiness};
use crate::logs::Throttle;
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// What the embedded deployment has beside its counter store.
pub(crate) struct Embedded {
    /// The in-process store and its snapshot table.
    snapshots: Snapshots,
    /// The same store, undoing a change whose entry could not be committed.
    undo: Arc<dyn Undoable>,
    /// The failpoints tests arm.
    faults: Arc<Faults>,
}

impl Embedded {
    /// The deployment of the in-process store `undo`, snapshotted through `snapshots`.
    pub(crate) fn new(snapshots: Snapshots, undo: Arc<dyn Undoable>) -> Self {
        Self {
            snapshots,
            undo,
            faults: Arc::default(),
        }
    }
}

#[async_trait]
impl Durability for Embedded {
    fn admit(&self) -> Result<(), EngineError> {
        Ok(())
    }

    fn appended(&self, _appended: bool) {}

    fn ledger_stream(&self, _shard: u16) -> Option<String> {
        None
    }

    fn answers_wait_for_commit(&self) -> bool {
        true
    }

    async fn commit_or_undo(
        &self,
        writer: &LedgerWriter,
        change: Change<'_>,
    ) -> Result<(), EngineError> {
        let Change {
            mut entries,
            now_ms,
            answer,
            undo,
        } = change;
        if let (Some(last), Some(answer)) = (entries.last_mut(), answer) {
            last.kept_answer = answer();
        }
        let counters = self.undo.clone();
        let change = Arc::new(undo());
        let undone = change.clone();
        let confirm = {
            let counters = counters.clone();
            move || counters.confirm(now_ms, &change)
        };
        let rollback = Rollback::new(
            move || {
                if let Err(error) = counters.undo(now_ms, &undone) {
                    static SITE: Throttle = Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::error!(error = %error, count, "undoing a change whose ledger entry failed");
                    }
                }
            },
            confirm,
        );
        if crate::engine::faults::fault!(self, "unit.commit") {
            drop(rollback); // undoes the change, as when a job is dropped unsent
            return Err(EngineError::from(LedgerError::unavailable(
                std::io::Error::other("failpoint unit.commit: the ledger commit failed"),
            )));
        }
        writer
            .append_or_undo(entries, Some(rollback))
            .await
            .map_err(EngineError::from)
    }

    async fn record_denied(
        &self,
        writer: &LedgerWriter,
        entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError> {
        match entries.is_empty() {
            true => Ok(()),
            false => writer.append(entries).await.map_err(EngineError::from),
        }
    }

    async fn raise_floors_now(&self, _shards: &[u16]) -> Result<(), StoreError> {
        Ok(())
    }

    async fn settle_streams(&self) -> Result<bool, EngineError> {
        Ok(false)
    }

    async fn drain_shards(&self, _shards: &BTreeSet<u16>) -> bool {
        true
    }

    async fn in_stream(
        &self,
        _stream: &str,
        _window: (i64, i64),
        _id: &str,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }

    async fn drain_now(&self) -> usize {
        0
    }

    async fn measure_backlog(&self) -> Option<u64> {
        None
    }

    fn backlog_max(&self) -> Option<u64> {
        None
    }

    async fn readiness(&self, _recovery: &Recovery) -> Readiness {
        Readiness {
            store: None,
            backlog_full: None,
            reasons: Vec::new(),
        }
    }

    async fn start_drain(&self, _janitor: &Arc<Janitor>) -> Option<JoinHandle<()>> {
        None
    }

    async fn start_watches(
        &self,
        _recovery: &Arc<Recovery>,
        _checkpoint_every: Option<Duration>,
    ) -> Vec<JoinHandle<()>> {
        Vec::new()
    }

    async fn reopen(
        &self,
        _recovery: &Recovery,
        _action: Option<&Action>,
    ) -> Result<Reopened, EngineError> {
        Ok(Reopened::default())
    }

    async fn rebuild(
        &self,
        _recovery: &Recovery,
        _action: Option<&Action>,
    ) -> anyhow::Result<Reopened> {
        anyhow::bail!("the counters are in process (no REDIS_URL): every start rebuilds them");
    }

    async fn checkpoint_now(&self, _recovery: &Recovery) -> anyhow::Result<Option<Saved>> {
        Ok(None)
    }

    async fn snapshot(&self, recovery: &Recovery, covered: Option<i64>) -> Option<Saved> {
        recovery.snapshot_into(&self.snapshots, covered).await
    }

    async fn entries_after(&self, covered: i64) -> Option<u64> {
        let last = self.snapshots.table.last_entry().await.ok()?;
        let last = last.map_or(0, |(seq, _)| seq);
        Some(u64::try_from(last.saturating_sub(covered)).unwrap_or(0))
    }

    async fn verify(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Verified, VerifyError> {
        recovery
            .verify_embedded(&self.snapshots, action, learn, known)
            .await
    }
}
