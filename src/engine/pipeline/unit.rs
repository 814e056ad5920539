//! The unit of work of every state change, as the decision path sees it: the change is
//! applied under the snapshot `cut` lock and its entries recorded as the deployment does
//! (`engine::deployment`): committed through the group-commit writer before the answer,
//! the change undone if they cannot be (in process), or streamed by the script in the same
//! atomic step (Redis).

use crate::domain::LedgerEntry;
use crate::engine::codec;
use crate::engine::deployment::Change;
use crate::engine::store::{LedgerAppend, StoreError, Undo};
use crate::engine::{Engine, EngineError};

impl Engine {
    /// Commits `entries`, the record of a change already applied to the counter store at
    /// `now_ms`; if they cannot be committed, `undo` takes the change back and the error
    /// is returned. A store that streams the ledger recorded them itself: nothing to do.
    pub(in crate::engine) async fn commit_or_undo(
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

    /// [`Engine::commit_or_undo`] of a decision's `entries`, the last (the first and only
    /// one, or the last of requests decided together) keeping `answer` where this
    /// instance writes them; a store that streams them kept the answer in its own copy.
    pub(in crate::engine) async fn commit_answered_or_undo(
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
    pub(in crate::engine) fn admit(&self) -> Result<(), EngineError> {
        self.durability.admit()
    }

    /// Counts a decided consume's stream entry towards the backlog, if it `appended` one
    /// (Redis only).
    pub(in crate::engine) fn appended(&self, appended: bool) {
        self.durability.appended(appended);
    }

    /// The stream entry a consume's script appends in `shard` if allowed, and if denied:
    /// `entries` encodes both. `None` when the ledger does not stream (in process).
    pub(in crate::engine) fn ledger_append(
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
        })
    }

    /// `entry` as a give-back script appends it to `shard`'s stream (Redis only).
    pub(in crate::engine) fn stream_entry(
        &self,
        shard: u16,
        entry: &LedgerEntry,
    ) -> Option<(String, String)> {
        let stream = self.durability.ledger_stream(shard)?;
        Some((stream, codec::encode_entry(entry)))
    }

    /// Records the entries of a denial, which changed nothing: the script streamed them on
    /// Redis; in process they are written like any entry.
    pub(in crate::engine) async fn record_denied(
        &self,
        entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError> {
        self.durability.record_denied(&self.writer, entries).await
    }

    /// Whether a kept answer waits as in flight until its entry is committed: in process,
    /// where the entry commits after the change ([`Engine::commit_or_undo`]).
    pub(in crate::engine) fn records_pending(&self) -> bool {
        self.durability.answers_wait_for_commit()
    }

    /// Records at once that `shards` were written to, so that a Redis node that comes back
    /// without the write is caught (`drain/floors.rs`); nothing to do where nothing streams.
    pub(in crate::engine) async fn raise_floors_now(
        &self,
        shards: &[u16],
    ) -> Result<(), StoreError> {
        self.durability.raise_floors_now(shards).await
    }

    /// Moves what the ledger streams hold into SQL now, so that a charge just made is
    /// found there; false when nothing streams (every entry is in SQL before its answer).
    /// A drain that could not move everything is an error: what was asked for may be
    /// waiting in a stream, not unknown.
    pub(in crate::engine) async fn settle_streams(&self) -> Result<bool, EngineError> {
        self.durability.settle_streams().await
    }
}
