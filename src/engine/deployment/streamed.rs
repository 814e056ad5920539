//! Redis: each script appends its change's entries to its shard's ledger stream in the
//! same atomic step, so there is nothing to undo; the drain moves them into SQL, the
//! backlog bounds what waits in the streams, calls answered 503 are voided when Redis
//! applied them, and the shards Redis lost are rebuilt from the ledger, from the last
//! checkpoint of its replay.

use super::{Change, Durability};
use crate::domain::{Action, LedgerEntry};
use crate::engine::faults::Faults;
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerError;
use crate::engine::pipeline::backlog::{Backlog, MEASURE_EVERY, MEMORY_LOOK_EVERY};
use crate::engine::pipeline::drain::Drainer;
use crate::engine::pipeline::writer::LedgerWriter;
use crate::engine::recovery::checkpoint::{Checkpoints, LOOK_EVERY};
use crate::engine::recovery::shards::{Reopened, SHARD_LOOK_EVERY};
use crate::engine::recovery::snapshot::{Saved, SnapshotStore};
use crate::engine::recovery::verify::{KnownByKey, Learn, Verified, VerifyError};
use crate::engine::recovery::void::VOID_EVERY;
use crate::engine::recovery::Recovery;
use crate::engine::shards::ShardStates;
use crate::engine::store::StoreError;
use crate::engine::{EngineError, Readiness};
use crate::keys;
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How long a rebuild waits for the streams of its shards to drain into SQL (entries
/// another instance's drain is writing, or the ledger database being down).
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// Stream entries read per step of the search for a call answered 503.
const SEARCH_PAGE: usize = 1_000;

/// What a Redis deployment runs beside its counter store.
pub(crate) struct Streamed {
    /// Moves streamed entries into SQL; refunds ask it to run at once when their charge
    /// is not in SQL yet.
    drain: Arc<Drainer>,
    /// The bound on what waits in the streams.
    backlog: Arc<Backlog>,
    /// The shards' epochs and locks, for rebuilding them from the ledger.
    shards: Arc<dyn ShardStates>,
    /// Where checkpoints of the ledger's replay are kept (`recovery::checkpoint`).
    checkpoints: Arc<dyn SnapshotStore>,
    /// The prefix of every key, the streams' among them.
    prefix: String,
}

impl Streamed {
    /// The deployment on Redis: its `drain` and the `backlog` bound, its `shards`, the
    /// table of `checkpoints`, its keys under `prefix`.
    pub(crate) fn new(
        drain: Arc<Drainer>,
        backlog: Backlog,
        shards: Arc<dyn ShardStates>,
        checkpoints: Arc<dyn SnapshotStore>,
        prefix: String,
    ) -> Self {
        Self {
            drain,
            backlog: Arc::new(backlog),
            shards,
            checkpoints,
            prefix,
        }
    }
}

/// Counts the ledger entries waiting in the streams now and bounds consumes by it.
async fn measure(drain: &Drainer, backlog: &Backlog) -> Option<u64> {
    let _one_at_a_time = backlog.measuring.lock().await;
    let before = backlog.measure_starts();
    let total = drain.backlog().await?;
    backlog.measured(total, before);
    Some(total)
}

#[async_trait]
impl Durability for Streamed {
    fn admit(&self) -> Result<(), EngineError> {
        match self.backlog.is_full() {
            true => Err(EngineError::BacklogFull {
                max: self.backlog.max(),
            }),
            false => Ok(()),
        }
    }

    fn appended(&self, appended: bool) {
        self.backlog.appended(u64::from(appended));
    }

    fn ledger_stream(&self, shard: u16) -> Option<String> {
        Some(keys::ledger_stream(&self.prefix, shard))
    }

    fn answers_wait_for_commit(&self) -> bool {
        false
    }

    async fn commit_or_undo(
        &self,
        _writer: &LedgerWriter,
        _change: Change<'_>,
    ) -> Result<(), EngineError> {
        Ok(()) // the script streamed the entries, and kept the answer in its own copy
    }

    async fn record_denied(
        &self,
        _writer: &LedgerWriter,
        _entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError> {
        Ok(()) // the script streamed them
    }

    async fn raise_floors_now(&self, shards: &[u16]) -> Result<(), StoreError> {
        self.drain.raise_floors_now(shards).await
    }

    async fn settle_streams(&self) -> Result<bool, EngineError> {
        match self.drain.drain_once_checked().await {
            Ok(_) => Ok(true),
            Err((_, why)) => Err(EngineError::Ledger(LedgerError::unavailable(
                std::io::Error::other(format!(
                    "the ledger streams could not be moved into SQL: {why}"
                )),
            ))),
        }
    }

    /// Entries appended meanwhile (by open shards, when every stream is drained for budgets
    /// shared by subjects) are not waited for: they cannot have charged closed shards.
    async fn drain_shards(&self, shards: &BTreeSet<u16>) -> bool {
        let started = Instant::now();
        let Some(marks) = self.drain.marks(shards.iter().copied()).await else {
            return false;
        };
        loop {
            self.drain.drain_once().await;
            if self.drain.drained_to(&marks).await == Some(true)
                && self.drain.totals_moved(shards.iter().copied()).await == Some(true)
            {
                return true;
            }
            if started.elapsed() > DRAIN_WAIT {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn in_stream(
        &self,
        stream: &str,
        window: (i64, i64),
        id: &str,
    ) -> Result<bool, StoreError> {
        if self.drain.appended(stream, window, id, SEARCH_PAGE).await? {
            return Ok(true);
        }
        self.drain.in_totals(stream, id).await
    }

    fn faults(&self) -> Arc<Faults> {
        self.drain.faults()
    }

    async fn drain_now(&self) -> usize {
        self.drain.drain_once().await
    }

    async fn measure_backlog(&self) -> Option<u64> {
        measure(&self.drain, &self.backlog).await
    }

    fn backlog_max(&self) -> Option<u64> {
        Some(self.backlog.max())
    }

    async fn readiness(&self, recovery: &Recovery) -> Readiness {
        let mut reasons = Vec::new();
        let pinged = recovery.counters().ping().await;
        match &pinged {
            Err(error) if !recovery.fails_open(error) => reasons.push(error.to_string()),
            Err(_) => {}
            Ok(()) => match self.shards.closed_shards().await.map(|c| c.len()) {
                Ok(0) => {}
                Ok(closed) => {
                    if !recovery.fails_open(&StoreError::Rebuilding { shard: 0 }) {
                        reasons.push(format!(
                            "{closed} counter-store shards are being rebuilt from the ledger"
                        ));
                    }
                }
                Err(error) if !recovery.fails_open(&error) => reasons.push(error.to_string()),
                Err(_) => {}
            },
        }
        let backlog_full = self.backlog.is_full();
        if backlog_full {
            reasons.push(
                "the ledger backlog waiting in Redis is full (QUOTA_LEDGER_BACKLOG_MAX)".to_owned(),
            );
        }
        Readiness {
            store: Some(pinged.is_ok()),
            backlog_full: Some(backlog_full),
            reasons,
        }
    }

    async fn start_drain(&self, janitor: &Arc<Janitor>) -> Option<JoinHandle<()>> {
        // Before the first request: the scripts check the shards against them.
        self.drain.read_floors().await;
        Some(self.drain.clone().spawn(janitor.clone()))
    }

    async fn start_watches(
        &self,
        recovery: &Arc<Recovery>,
        checkpoint_every: Option<Duration>,
    ) -> Vec<JoinHandle<()>> {
        let voids = {
            let recovery = recovery.clone();
            tokio::spawn(async move { recovery.void_every(VOID_EVERY).await })
        };
        // Before the first request, so that a full backlog is known from the start.
        self.measure_backlog().await;
        let mut tasks = vec![voids, self.watch(recovery.clone())];
        if let Some(every) = checkpoint_every {
            tasks.push(self.checkpoint_every(recovery.clone(), every));
        }
        tasks
    }

    async fn reopen(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
    ) -> Result<Reopened, EngineError> {
        recovery
            .reopen_shards(&self.shards, self.checkpoints.as_ref(), action)
            .await
    }

    async fn rebuild(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
    ) -> anyhow::Result<Reopened> {
        recovery
            .rebuild_shards(&self.shards, self.checkpoints.as_ref(), action)
            .await
    }

    async fn checkpoint_now(&self, recovery: &Recovery) -> anyhow::Result<Option<Saved>> {
        recovery.checkpoint_now_in(self.checkpoints.as_ref()).await
    }

    async fn snapshot(&self, _recovery: &Recovery, _covered: Option<i64>) -> Option<Saved> {
        None // Redis keeps its own; the checkpoints bound a rebuild's replay
    }

    async fn entries_after(&self, _covered: i64) -> Option<u64> {
        None
    }

    async fn verify(
        &self,
        recovery: &Recovery,
        action: Option<&Action>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Verified, VerifyError> {
        recovery
            .verify_streamed(&self.shards, action, learn, known)
            .await
    }
}

impl Streamed {
    /// Counts the ledger entries waiting in the streams every [`MEASURE_EVERY`] while any
    /// may wait (this instance appended since the last count, or the last count found
    /// some), which bounds consumes by `QUOTA_LEDGER_BACKLOG_MAX`; looks at Redis's memory
    /// settings every [`MEMORY_LOOK_EVERY`]; and rebuilds the shards that lost their epoch,
    /// as soon as a decision finds one and (the janitor only) every [`SHARD_LOOK_EVERY`].
    fn watch(&self, recovery: Arc<Recovery>) -> JoinHandle<()> {
        let (drain, backlog) = (self.drain.clone(), self.backlog.clone());
        tokio::spawn(async move {
            let mut full = false;
            let mut last_look = Instant::now();
            let mut last_shard_look: Option<Instant> = None;
            loop {
                tokio::time::sleep(MEASURE_EVERY).await;
                if backlog.may_wait() {
                    measure(&drain, &backlog).await;
                }
                let janitor = recovery.janitor().held();
                let look =
                    janitor && last_shard_look.is_none_or(|at| at.elapsed() >= SHARD_LOOK_EVERY);
                if look {
                    last_shard_look = Some(Instant::now());
                }
                recovery.reopen_if_wanted(look).await;
                if last_look.elapsed() >= MEMORY_LOOK_EVERY {
                    last_look = Instant::now();
                    recovery.counters().memory().await;
                }
                if backlog.is_full() != full {
                    full = !full;
                    match full {
                        true => tracing::warn!("ledger backlog full: consumes are answered 503 until the drain moves entries into SQL"),
                        false => tracing::info!("ledger backlog below its bound again: consumes are served"),
                    }
                }
            }
        })
    }

    /// The janitor's checkpoints of the ledger's replay, `every` so often
    /// (`QUOTA_CHECKPOINT_EVERY_S`): a shard whose Redis data was lost is then rebuilt from
    /// the entries after the last one.
    fn checkpoint_every(&self, recovery: Arc<Recovery>, every: Duration) -> JoinHandle<()> {
        let table = self.checkpoints.clone();
        tokio::spawn(async move {
            let mut checkpoints = Checkpoints::default();
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(LOOK_EVERY).await;
                if !recovery.janitor().held() {
                    // Another instance keeps them: the replayed state is dropped.
                    checkpoints = Checkpoints::default();
                    continue;
                }
                let due = last.elapsed() >= every;
                if due {
                    last = tokio::time::Instant::now();
                }
                let result = recovery
                    .checkpoint_settled(table.as_ref(), &mut checkpoints, due)
                    .await;
                // Once per checkpoint due, not at every look (the ledger database may be down).
                if let (true, Err(error)) = (due, result) {
                    tracing::warn!(error = %error, "checkpointing the ledger's replay failed; will retry");
                }
            }
        })
    }
}
