//! Group-commit writer for the embedded default.
//!
//! Without Redis there is no stream to drain later, so an allowed consume must be in the
//! ledger *before* it is answered: otherwise a crash right after the answer would lose a
//! charge the client was told about. Committing one transaction per request would cap
//! throughput at the disk's fsync rate, so requests share commits instead: one task takes
//! everything queued (up to [`MAX_BATCH`] entries), writes it in one
//! [`LedgerStore::append`] (one transaction), and only then answers every waiter of that
//! batch. While a batch commits, the next one queues up, so the busier the service, the
//! larger the batches and the fewer the fsyncs per entry.

use crate::domain::LedgerEntry;
use crate::engine::ledger::{LedgerError, LedgerStore};
use crate::engine::pipeline::lag::Lag;
use crate::logs::Throttle;
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// Entries per batch, roughly: a request's entries are never split across batches, so a
/// batch may pass this by one request's worth.
pub(crate) const MAX_BATCH: usize = 1_000;

/// Requests that may wait in the queue; beyond it, callers wait for room (back-pressure
/// instead of unbounded memory when the database is slow).
const QUEUE_DEPTH: usize = 8_192;

/// One caller's entries, where to send the outcome, and what undoes the caller's change
/// if the entries are not committed.
struct Job {
    entries: Vec<LedgerEntry>,
    done: oneshot::Sender<Result<(), LedgerError>>,
    rollback: Option<Rollback>,
}

/// Undoes a change in the counter store unless its entries were committed: it runs when
/// dropped unconfirmed, wherever that happens (the writer after a failed batch, or a job
/// that never reached the writer because its caller was cancelled or the writer is gone),
/// so that no path leaves a change behind without its entry. The writer runs it before it
/// answers the caller, so a caller told of the failure finds the change undone.
pub(crate) struct Rollback {
    undo: Option<Box<dyn FnOnce() + Send>>,
    confirm: Option<Box<dyn FnOnce() + Send>>,
}

impl Rollback {
    /// A rollback that runs `undo` unless confirmed, and `confirm` when confirmed.
    pub(crate) fn new(
        undo: impl FnOnce() + Send + 'static,
        confirm: impl FnOnce() + Send + 'static,
    ) -> Self {
        Self {
            undo: Some(Box::new(undo)),
            confirm: Some(Box::new(confirm)),
        }
    }

    /// The entries are committed: nothing to undo, and what waited for it is kept.
    fn confirm(mut self) {
        self.undo = None;
        if let Some(confirm) = self.confirm.take() {
            confirm();
        }
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo();
        }
    }
}

impl std::fmt::Debug for Rollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.undo {
            Some(_) => "Rollback(armed)",
            None => "Rollback(confirmed)",
        })
    }
}

/// A handle to the writer task; clones share the task.
///
/// The task ends once every handle is gone, after writing what was queued until then.
#[derive(Debug, Clone)]
pub struct LedgerWriter {
    queue: mpsc::Sender<Job>,
}

impl LedgerWriter {
    /// Starts the writer task on the current Tokio runtime.
    pub fn spawn(store: Arc<dyn LedgerStore>) -> Self {
        Self::spawn_recording(store, Arc::default())
    }

    /// [`LedgerWriter::spawn`], recording each committed entry's lag in `lag`.
    pub fn spawn_recording(store: Arc<dyn LedgerStore>, lag: Arc<Lag>) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(store, jobs, lag));
        Self { queue }
    }

    /// Queues `entries` and resolves once they are committed (or the batch failed).
    ///
    /// If the caller stops waiting (its request was cancelled), the entries are still
    /// written: the charge they record happened.
    pub async fn append(&self, entries: Vec<LedgerEntry>) -> Result<(), LedgerError> {
        self.append_or_undo(entries, None).await
    }

    /// [`LedgerWriter::append`] of the entries of a change already applied to the counter
    /// store: unless they are committed, `rollback` undoes it (see [`Rollback`]).
    pub(crate) async fn append_or_undo(
        &self,
        entries: Vec<LedgerEntry>,
        rollback: Option<Rollback>,
    ) -> Result<(), LedgerError> {
        if entries.is_empty() {
            return Ok(());
        }
        let span = match crate::logs::spans_exported() {
            true => tracing::trace_span!(
                "sql",
                otel.name = "sql ledger insert (group commit)",
                otel.kind = "client",
                db.operation = "INSERT",
                entries = entries.len(),
            ),
            false => tracing::Span::none(),
        };
        let (done, outcome) = oneshot::channel();
        async {
            self.queue
                .send(Job {
                    entries,
                    done,
                    rollback,
                })
                .await
                .map_err(|_| gone())?;
            outcome.await.map_err(|_| gone())?
        }
        .instrument(span)
        .await
    }

    /// Resolves once every entry queued before it was committed (or its batch failed):
    /// the queue is served in order, and this waits for a batch of its own behind them.
    pub(crate) async fn flush(&self) -> Result<(), LedgerError> {
        let (done, outcome) = oneshot::channel();
        let job = Job {
            entries: Vec::new(),
            done,
            rollback: None,
        };
        self.queue.send(job).await.map_err(|_| gone())?;
        outcome.await.map_err(|_| gone())?
    }
}

/// The error of a caller whose writer task is gone (it panicked, or the runtime is
/// shutting down): the entries may not be written, so this is a failure (503).
fn gone() -> LedgerError {
    LedgerError::unavailable(std::io::Error::other("the ledger writer is gone"))
}

/// The writer task: batches of whatever is queued, until every handle is dropped and
/// the queue is empty.
async fn run(store: Arc<dyn LedgerStore>, mut jobs: mpsc::Receiver<Job>, lag: Arc<Lag>) {
    while let Some(first) = jobs.recv().await {
        let mut count = first.entries.len();
        let mut batch = vec![first];
        while count < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => {
                    count += job.entries.len();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        commit(store.as_ref(), batch, &lag).await;
    }
    tracing::debug!("ledger writer stopped: every handle was dropped");
}

/// A caller of a batch: its entries' range, where its outcome goes, and its rollback.
type Waiter = (
    Range<usize>,
    oneshot::Sender<Result<(), LedgerError>>,
    Option<Rollback>,
);

/// Writes one batch and answers each of its callers (undoing the changes of those whose
/// entries were not committed first).
async fn commit(store: &dyn LedgerStore, batch: Vec<Job>, lag: &Lag) {
    let mut entries = Vec::with_capacity(batch.iter().map(|j| j.entries.len()).sum());
    let mut waiters: Vec<Waiter> = Vec::with_capacity(batch.len());
    for job in batch {
        let start = entries.len();
        entries.extend(job.entries);
        waiters.push((start..entries.len(), job.done, job.rollback));
    }
    // The consumes recorded in the totals go in as a few folded rows (see `fold`).
    let folded = super::fold::fold(&entries);
    match store.append(folded.as_deref().unwrap_or(&entries)).await {
        Ok(_) => {
            lag.observe_committed(entries.iter().map(|e| e.at));
            for (_, done, rollback) in waiters {
                if let Some(rollback) = rollback {
                    rollback.confirm();
                }
                // A caller that stopped waiting is fine: its entries are committed.
                let _ = done.send(Ok(()));
            }
        }
        // A constraint broken by one request must not fail the others of its batch:
        // the transaction rolled back, so write each request on its own (ids make
        // this safe even if some had been written before).
        Err(LedgerError::Corrupt(why)) if waiters.len() > 1 => {
            static SITE: Throttle = Throttle::new();
            if let Some(count) = SITE.event() {
                tracing::warn!(
                    error = %why,
                    requests = waiters.len(),
                    count,
                    "a ledger batch was refused; writing its requests one by one"
                );
            }
            for (range, done, rollback) in waiters {
                let outcome = store.append(&entries[range]).await.map(|_| ());
                if let (Ok(()), Some(rollback)) = (&outcome, rollback) {
                    rollback.confirm();
                }
                let _ = done.send(outcome);
            }
        }
        Err(error) => {
            // Logged here, at most once a second with the count of failed batches: a
            // caller that stopped waiting will not log it, and an outage fails every batch.
            static SITE: Throttle = Throttle::new();
            if let Some(count) = SITE.event() {
                let cause = std::error::Error::source(&error).map(ToString::to_string);
                tracing::error!(
                    error = %error,
                    cause = cause.as_deref(),
                    entries = entries.len(),
                    requests = waiters.len(),
                    count,
                    "writing a ledger batch failed; its callers are told so and their changes undone"
                );
            }
            for (_, done, rollback) in waiters {
                drop(rollback);
                let _ = done.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
