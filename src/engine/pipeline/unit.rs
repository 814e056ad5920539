//! The unit of work of every state change on a store that does not stream the ledger (the
//! in-process store): the change is applied under the snapshot `cut` lock, its entries
//! are committed through the group-commit writer, and if they cannot be the change is
//! undone before the caller is answered (a 503 that leaves nothing behind).
//!
//! The store applies a change at once, so concurrent decisions count it while its entry
//! commits: they may be denied by a change that is then undone (never allowed past a
//! limit). Its kept answer waits as in flight until the entry is committed: a retry with
//! the same idempotency key meanwhile waits for the outcome (a replay once committed, a
//! fresh decision once undone), never replayed an answer that may yet be undone. The undo is a [`Rollback`] handed to the writer with the entries, so it runs
//! even when the request is cancelled while it waits. On Redis the script appends the
//! entry to its stream in the same atomic step, so there is nothing to undo.

use crate::domain::LedgerEntry;
use crate::engine::codec;
use crate::engine::deployment::Deployment;
use crate::engine::ledger::LedgerError;
use crate::engine::pipeline::writer::Rollback;
use crate::engine::store::{LedgerAppend, StoreError, Undo};
use crate::engine::{Engine, EngineError};
use crate::keys;
use crate::logs::Throttle;

impl Engine {
    /// Commits `entries`, the record of a change already applied to the counter store at
    /// `now_ms`; if they cannot be committed, `undo` takes the change back and the error
    /// is returned. A store that streams the ledger recorded them itself: nothing to do.
    pub(in crate::engine) async fn commit_or_undo(
        &self,
        entries: Vec<LedgerEntry>,
        now_ms: i64,
        undo: impl FnOnce() -> Undo,
    ) -> Result<(), EngineError> {
        let counters = match &self.deployment {
            Deployment::Embedded(embedded) => embedded.undo.clone(),
            Deployment::Streamed(_) => return Ok(()),
        };
        let change = std::sync::Arc::new(undo());
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
            return Err(EngineError::from(
                crate::engine::ledger::LedgerError::unavailable(std::io::Error::other(
                    "failpoint unit.commit: the ledger commit failed",
                )),
            ));
        }
        self.writer
            .append_or_undo(entries, Some(rollback))
            .await
            .map_err(EngineError::from)
    }
}

impl Engine {
    /// [`Engine::commit_or_undo`] of a decision's `entries`, the last (the first and only
    /// one, or the last of requests decided together) keeping `answer`: only when this
    /// instance writes them; a store that streams them kept the answer in its own copy.
    pub(in crate::engine) async fn commit_answered_or_undo(
        &self,
        mut entries: Vec<LedgerEntry>,
        now_ms: i64,
        answer: impl FnOnce() -> Option<crate::domain::KeptAnswer>,
        undo: impl FnOnce() -> Undo,
    ) -> Result<(), EngineError> {
        if self.deployment.streams_ledger() {
            return Ok(());
        }
        if let Some(last) = entries.last_mut() {
            last.kept_answer = answer();
        }
        self.commit_or_undo(entries, now_ms, undo).await
    }

    /// Whether a consume may charge now: not while the ledger backlog waiting in the Redis
    /// streams is full (`engine::backlog`; nothing waits in process).
    pub(in crate::engine) fn admit(&self) -> Result<(), EngineError> {
        match self.deployment.backlog().filter(|b| b.is_full()) {
            Some(backlog) => Err(EngineError::BacklogFull { max: backlog.max() }),
            None => Ok(()),
        }
    }

    /// Counts a decided consume's stream entry towards the backlog, if it `appended` one
    /// (Redis only).
    pub(in crate::engine) fn appended(&self, appended: bool) {
        if let Some(backlog) = self.deployment.backlog() {
            backlog.appended(u64::from(appended));
        }
    }

    /// The stream entry a consume's script appends in `shard` if allowed, and if denied:
    /// `entries` encodes both. `None` when the ledger does not stream (in process).
    pub(in crate::engine) fn ledger_append(
        &self,
        shard: u16,
        entries: impl FnOnce() -> (String, Option<String>),
    ) -> Option<LedgerAppend> {
        self.deployment.streams_ledger().then(|| {
            let (allowed, denied) = entries();
            LedgerAppend {
                stream: keys::ledger_stream(&self.prefix, shard),
                allowed,
                denied,
                keeps_answer: false,
                on_crossing: None,
            }
        })
    }

    /// `entry` as a give-back script appends it to `shard`'s stream (Redis only).
    pub(in crate::engine) fn stream_entry(
        &self,
        shard: u16,
        entry: &LedgerEntry,
    ) -> Option<(String, String)> {
        self.deployment.streams_ledger().then(|| {
            (
                keys::ledger_stream(&self.prefix, shard),
                codec::encode_entry(entry),
            )
        })
    }

    /// Records the entries of a denial, which changed nothing: the script streamed them on
    /// Redis; in process they are written like any entry.
    pub(in crate::engine) async fn record_denied(
        &self,
        entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError> {
        match self.deployment.streams_ledger() || entries.is_empty() {
            true => Ok(()),
            false => self.record(entries).await,
        }
    }

    /// Whether a kept answer waits as in flight until its entry is committed: in process,
    /// where the entry commits after the change ([`Engine::commit_or_undo`]).
    pub(in crate::engine) fn records_pending(&self) -> bool {
        !self.deployment.streams_ledger()
    }

    /// Records at once that `shards` were written to, so that a Redis node that comes back
    /// without the write is caught (`drain/floors.rs`); nothing to do where nothing streams.
    pub(in crate::engine) async fn raise_floors_now(
        &self,
        shards: &[u16],
    ) -> Result<(), StoreError> {
        match self.deployment.drain() {
            Some(drain) => drain.raise_floors_now(shards).await,
            None => Ok(()),
        }
    }

    /// Moves what the ledger streams hold into SQL now, so that a charge just made is
    /// found there; false when nothing streams (every entry is in SQL before its answer).
    /// A drain that could not move everything is an error: what was asked for may be
    /// waiting in a stream, not unknown.
    pub(in crate::engine) async fn settle_streams(&self) -> Result<bool, EngineError> {
        match self.deployment.drain() {
            Some(drain) => match drain.drain_once_checked().await {
                Ok(_) => Ok(true),
                Err((_, why)) => Err(EngineError::Ledger(LedgerError::unavailable(
                    std::io::Error::other(format!(
                        "the ledger streams could not be moved into SQL: {why}"
                    )),
                ))),
            },
            None => Ok(false),
        }
    }
}
