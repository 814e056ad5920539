//! The unit of work of every state change, as the decision path sees it: the change is
//! applied under the snapshot `cut` lock and its entries recorded as the deployment does
//! (`engine::deployment`): committed through the group-commit writer before the answer,
//! the change undone if they cannot be (in process), or streamed by the script in the same
//! atomic step (Redis).

use crate::domain::LedgerEntry;
use crate::engine::codec;
use crate::engine::deployment::{Change, Durability};
use crate::engine::pipeline::writer::LedgerWriter;
use crate::engine::store::{LedgerAppend, StoreError, Undo};
use crate::engine::EngineError;
use std::sync::Arc;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The ledger pipeline: where a change decided by the counter store becomes a committed
/// entry, as the deployment does it.
pub(crate) struct Pipeline {
    /// In process or on Redis: chosen once, in `startup`.
    durability: Arc<dyn Durability>,
    /// Writes entries to the ledger before the answer where the counter store does not
    /// stream them (the embedded default), and degraded allows.
    writer: LedgerWriter,
    /// Every change to the counter store holds it (shared) from the store call until its
    /// ledger entry is committed; a snapshot holds it alone while it copies the store, so
    /// the copy is exactly the replay of the entries committed by then (a consistent cut).
    cut: RwLock<()>,
}

impl Pipeline {
    /// The pipeline of `durability`, writing through `writer`.
    pub(crate) fn new(durability: Arc<dyn Durability>, writer: LedgerWriter) -> Self {
        Self {
            durability,
            writer,
            cut: RwLock::new(()),
        }
    }

    /// The deployment.
    pub(crate) fn durability(&self) -> &dyn Durability {
        self.durability.as_ref()
    }

    /// Held (shared) by a change from its store call until its entry is committed.
    pub(crate) async fn change(&self) -> RwLockReadGuard<'_, ()> {
        self.cut.read().await
    }

    /// Holds changes back, once those under way committed their entries, and flushes the
    /// writer: the store then equals the replay of every committed entry (a cut).
    pub(crate) async fn pause(&self) -> Result<RwLockWriteGuard<'_, ()>, EngineError> {
        let paused = self.cut.write().await;
        self.writer.flush().await?;
        Ok(paused)
    }

    /// Writes ledger entries durably (group commit) before the caller answers: where the
    /// counter store does not stream them (the embedded default), and degraded allows.
    pub(crate) async fn record(&self, entries: Vec<LedgerEntry>) -> Result<(), EngineError> {
        self.writer.append(entries).await.map_err(EngineError::from)
    }

    /// Commits `entries`, the record of a change already applied to the counter store at
    /// `now_ms`; if they cannot be committed, `undo` takes the change back and the error
    /// is returned. A store that streams the ledger recorded them itself: nothing to do.
    pub(crate) async fn commit_or_undo(
        &self,
        entries: Vec<LedgerEntry>,
        now_ms: i64,
        undo: &(dyn Fn() -> Undo + Sync),
    ) -> Result<(), EngineError> {
        let change = Change {
            entries,
            now_ms,
            answer: None,
            undo,
        };
        self.durability.commit_or_undo(&self.writer, change).await
    }

    /// [`Pipeline::commit_or_undo`] of a decision's `entries`, the last (the first and only
    /// one, or the last of requests decided together) keeping `answer` where this
    /// instance writes them; a store that streams them kept the answer in its own copy.
    pub(crate) async fn commit_answered_or_undo(
        &self,
        entries: Vec<LedgerEntry>,
        now_ms: i64,
        answer: &(dyn Fn() -> Option<crate::domain::KeptAnswer> + Sync),
        undo: &(dyn Fn() -> Undo + Sync),
    ) -> Result<(), EngineError> {
        let change = Change {
            entries,
            now_ms,
            answer: Some(answer),
            undo,
        };
        self.durability.commit_or_undo(&self.writer, change).await
    }

    /// Whether a consume may charge now: not while the ledger backlog waiting in the Redis
    /// streams is full (`engine::backlog`; nothing waits in process).
    pub(crate) fn admit(&self) -> Result<(), EngineError> {
        self.durability.admit()
    }

    /// Counts a decided consume's stream entry towards the backlog, if it `appended` one
    /// (Redis only).
    pub(crate) fn appended(&self, appended: bool) {
        self.durability.appended(appended);
    }

    /// The stream entry a consume's script appends in `shard` if allowed, and if denied:
    /// `entries` encodes both. `None` when the ledger does not stream (in process).
    pub(crate) fn ledger_append(
        &self,
        shard: u16,
        entries: impl FnOnce() -> (String, Option<String>),
    ) -> Option<LedgerAppend> {
        let stream = self.durability.ledger_stream(shard)?;
        let (allowed, denied) = entries();
        Some(LedgerAppend {
            stream,
            allowed,
            denied,
            keeps_answer: false,
            on_crossing: None,
            totals: None,
        })
    }

    /// `entry` as a give-back script appends it to `shard`'s stream (Redis only).
    pub(crate) fn stream_entry(&self, shard: u16, entry: &LedgerEntry) -> Option<(String, String)> {
        let stream = self.durability.ledger_stream(shard)?;
        Some((stream, codec::encode_entry(entry)))
    }

    /// Records the entries of a denial, which changed nothing: the script streamed them on
    /// Redis; in process they are written like any entry.
    pub(crate) async fn record_denied(&self, entries: Vec<LedgerEntry>) -> Result<(), EngineError> {
        self.durability.record_denied(&self.writer, entries).await
    }

    /// Whether this instance commits a decided change's entries itself (in process), rather
    /// than the script streaming them in its atomic step (Redis): only then does
    /// [`Pipeline::commit_or_undo`] or [`Pipeline::record_denied`] need the entries.
    pub(crate) fn commits_entries(&self) -> bool {
        self.durability.answers_wait_for_commit()
    }

    /// Whether a kept answer waits as in flight until its entry is committed: in process,
    /// where the entry commits after the change ([`Pipeline::commit_or_undo`]).
    pub(crate) fn records_pending(&self) -> bool {
        self.durability.answers_wait_for_commit()
    }

    /// Records at once that `shards` were written to, so that a Redis node that comes back
    /// without the write is caught (`drain/floors.rs`); nothing to do where nothing streams.
    pub(crate) async fn raise_floors_now(&self, shards: &[u16]) -> Result<(), StoreError> {
        self.durability.raise_floors_now(shards).await
    }

    /// Moves what the ledger streams hold into SQL now, so that a charge just made is
    /// found there; false when nothing streams (every entry is in SQL before its answer).
    /// A drain that could not move everything is an error: what was asked for may be
    /// waiting in a stream, not unknown.
    pub(crate) async fn settle_streams(&self) -> Result<bool, EngineError> {
        self.durability.settle_streams().await
    }
}
