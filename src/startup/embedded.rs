//! The embedded default's start and stop: its in-process counters rebuilt from the last
//! snapshot and the ledger before the first request, snapshotted every few minutes while
//! it runs, and again at graceful shutdown once nothing changes them any more; and the
//! hold sweeper, which is stopped between two sweeps before that.

use crate::api::AppState;
use crate::engine::recovery::snapshot::{SnapshotStore, Snapshots};
use crate::engine::state::Replay;
use crate::engine::{Engine, Restored};
use actix_web::web;
use anyhow::Context;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The in-process counter store and where its snapshots are kept.
pub(super) struct Embedded {
    /// The store the engine decides with (fresh until `restore`).
    pub(super) store: Arc<dyn Replay>,
    /// The snapshot table of the ledger's database.
    pub(super) snapshots: Arc<dyn SnapshotStore>,
}

impl Embedded {
    /// Loads the last snapshot (if usable) and replays the ledger after it, or replays
    /// the whole horizon; then releases the holds that expired meanwhile.
    pub(super) async fn restore(&self, engine: &Engine) -> anyhow::Result<Restored> {
        let restored = engine
            .recovery()
            .restore(self.store.as_ref(), self.snapshots.as_ref())
            .await
            .context("rebuilding usage, holds and kept answers from the snapshot and ledger")?;
        let expired = engine.expire_due_holds().await;
        tracing::info!(
            snapshot_seq = restored.snapshot_seq,
            loaded = restored.loaded,
            entries = restored.entries,
            steps = restored.steps,
            expired,
            "rebuilt the in-process counters from the ledger"
        );
        Ok(restored)
    }

    /// The engine's ports for snapshots.
    pub(super) fn ports(&self) -> Snapshots {
        Snapshots {
            store: self.store.clone(),
            table: self.snapshots.clone(),
        }
    }
}

/// The longest a running embedded service goes without snapshotting its counters while the
/// ledger gains entries; a busy one snapshots sooner, once `QUOTA_SNAPSHOT_ENTRIES` entries
/// were committed after the last snapshot, so that a start after kill -9 replays at most
/// about that many. Each snapshot holds changes to the counters back while it copies the
/// store (milliseconds per hundred thousand items; encoding and saving happen after).
const SNAPSHOT_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// How often the task looks at how many entries the ledger gained (one indexed read of its
/// last `seq`).
const SNAPSHOT_LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The task that snapshots the in-process counters every [`SNAPSHOT_EVERY`], or sooner
/// after `entries` ledger entries; aborted when dropped (a snapshot cut off while saving is
/// rolled back whole).
pub(super) struct Periodic(JoinHandle<()>);

impl Periodic {
    /// Starts snapshotting `engine`'s store; `covered` is the seq the snapshot loaded at
    /// start covers: while the ledger gains no entry, there is nothing new to save.
    /// `entries`: snapshot once the ledger gained that many after `covered` (0: by time only).
    pub(super) fn spawn(engine: Arc<Engine>, mut covered: Option<i64>, entries: u64) -> Self {
        Self(tokio::spawn(async move {
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(SNAPSHOT_LOOK_EVERY).await;
                let busy = entries > 0
                    && engine
                        .entries_after(covered.unwrap_or(0))
                        .await
                        .is_some_and(|gained| gained >= entries);
                if !busy && last.elapsed() < SNAPSHOT_EVERY {
                    continue;
                }
                last = tokio::time::Instant::now();
                if let Some(saved) = engine.snapshot_unless_covered(covered).await {
                    covered = Some(saved.covered_seq);
                }
            }
        }))
    }

    /// Stops the task, and waits until it has.
    pub(super) async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the holds known to fall due are released.
const HOLD_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Every how many hold sweeps the janitor looks for unfinished consumes across slots.
const ATTEMPT_SWEEP_TICKS: u32 = 10;

/// Every how many hold sweeps the janitor looks at every shard's holds.
const HOLD_LOOK_TICKS: u32 = 60;

/// The task that releases holds that expired unsettled. Safe with several instances: the
/// release changes a hold's state only if it is still open, so each hold expires at most
/// once. Aborted when dropped; [`Sweeper::stop`] stops it between two sweeps instead, so
/// that no expiry is left half done (given back in the store, not yet in the ledger).
pub(super) struct Sweeper {
    /// Set to true to stop.
    stop: watch::Sender<bool>,
    /// The task, until it is stopped.
    task: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Starts sweeping every [`HOLD_SWEEP_EVERY`].
    pub(super) fn spawn(state: web::Data<AppState>) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticks: u32 = 0;
            // Ticks since the janitor's last look at every shard's holds (none yet).
            let mut since_look: Option<u32> = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HOLD_SWEEP_EVERY) => {}
                    _ = stopped.changed() => break,
                }
                ticks = ticks.wrapping_add(1);
                let janitor = state.engine.janitor().held();
                since_look = match janitor {
                    true => since_look.map(|t| t.saturating_add(1)),
                    // On becoming the janitor, it looks at once.
                    false => None,
                };
                if janitor && since_look.is_none_or(|t| t >= HOLD_LOOK_TICKS) {
                    since_look = Some(0);
                    state.engine.decider().look_for_holds().await;
                }
                let expired = state.engine.decider().expire_scheduled_holds().await;
                if expired > 0 {
                    tracing::info!(expired, "released expired holds");
                }
                // Every 5 s, the janitor: a read of each of the 64 shards' intents (Redis
                // Cluster with shared budgets only), well within the 60 s a crash's charges
                // may last.
                if janitor && ticks.is_multiple_of(ATTEMPT_SWEEP_TICKS) {
                    let resolved = state.engine.decider().resolve_attempts().await;
                    if resolved > 0 {
                        tracing::info!(resolved, "abandoned consumes across slots left unfinished");
                    }
                }
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops the sweeper after the sweep under way, if any.
    pub(super) async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
