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

use super::store::Undo;
use super::writer::Rollback;
use super::{Engine, EngineError};
use crate::domain::LedgerEntry;
use crate::logs::Throttle;

impl Engine {
    /// Commits `entries`, the record of a change already applied to the counter store at
    /// `now_ms`; if they cannot be committed, `undo` takes the change back and the error
    /// is returned. A store that streams the ledger recorded them itself: nothing to do.
    pub(super) async fn commit_or_undo(
        &self,
        entries: Vec<LedgerEntry>,
        now_ms: i64,
        undo: impl FnOnce() -> Undo,
    ) -> Result<(), EngineError> {
        if self.counters.streams_ledger() {
            return Ok(());
        }
        let change = std::sync::Arc::new(undo());
        let (counters, undone) = (self.counters.clone(), change.clone());
        let confirm = {
            let counters = self.counters.clone();
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
        if super::faults::fault!(self, "unit.commit") {
            drop(rollback); // undoes the change, as when a job is dropped unsent
            return Err(EngineError::from(super::ledger::LedgerError::unavailable(
                std::io::Error::other("failpoint unit.commit: the ledger commit failed"),
            )));
        }
        self.writer
            .append_or_undo(entries, Some(rollback))
            .await
            .map_err(EngineError::from)
    }
}
