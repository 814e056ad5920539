//! Rebuilding the counter store's shards from the ledger (Redis): the ledger is the book of
//! record, Redis its cache.
//!
//! Every shard of the counter store has an **epoch** key, set when its state was rebuilt
//! from the ledger. Every script checks it in the same call as its decision: a shard
//! without one (Redis lost its data, a failover to an empty replica, or a first start) is
//! never decided on; the call answers [`StoreError::Rebuilding`], which follows
//! `QUOTA_ON_STORE_ERROR` (503 by default), and the engine rebuilds it:
//!
//! 1. it takes the shard's **lock** (one instance rebuilds a shard; the others wait);
//! 2. it **drains** the ledger streams, so that every entry Redis still holds is in SQL;
//! 3. it **replays** the ledger's entries of the shard (the horizon of
//!    [`rebuild`](crate::engine::recovery::rebuild)) into a fresh in-process store, the same replay the
//!    embedded default starts with; from the last
//!    [`checkpoint`](crate::engine::recovery::checkpoint) of the ledger's replay on, when there
//!    is one, so that it reads the entries of the last seconds, not of the horizon;
//! 4. it **writes** that store's state into Redis as absolute values (counters, hold records
//!    and the index of open holds, refunded totals), while the shard is still closed and the
//!    lock still its own: written twice, nothing changes;
//! 5. it **opens** the shard (sets the epoch) in the same call as the last write.
//!
//! Consumes on a closed shard never see a counter the ledger shows charged as empty. What
//! Redis held and had not drained when it lost its data (the last entries of its streams)
//! is lost with it. An operator can close shards on purpose (`quota-ledger counters
//! rebuild`): after restoring Redis from an old backup, say.

use crate::domain::{Action, LedgerEntry};
use crate::engine::followup::Followup;
use crate::engine::recovery::snapshot::SnapshotStore;
use crate::engine::recovery::Recovery;
use crate::engine::shards::ShardStates;
use crate::engine::state::{Replay, StateItem};
use crate::engine::store::StoreError;
use crate::engine::EngineError;
use crate::keys;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How long a rebuild lock lasts without being extended; extended at every write and every
/// [`LOCK_KEEP_EVERY`] meanwhile. An instance that dies mid-rebuild holds the shard closed
/// this long at most.
const LOCK_TTL_MS: u64 = 30_000;

/// How long `counters rebuild` waits for shards that other instances rebuild.
const REBUILD_WAIT: Duration = Duration::from_secs(600);

/// How often the janitor looks for shards without an epoch (Redis lost their data while no
/// request came), besides when a decision of any instance finds one.
pub(crate) const SHARD_LOOK_EVERY: Duration = Duration::from_secs(30);

/// How many shards a rebuild writes into Redis at once.
const WRITES_AT_ONCE: usize = 4;

/// How often a rebuilding instance extends its locks while it replays the ledger.
const LOCK_KEEP_EVERY: Duration = Duration::from_secs(10);

/// What a rebuild of shards did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reopened {
    /// The shards rebuilt and opened by this call.
    pub shards: Vec<u16>,
    /// Ledger entries read.
    pub entries: usize,
    /// State items written.
    pub items: usize,
    /// How long the replay took (the checkpoint loaded, the entries after it replayed).
    pub replay: Duration,
    /// How long writing the state into Redis took.
    pub write: Duration,
}

/// Whether `entry` is a folded row (many subjects' consumes recorded in totals, named by
/// no subject of theirs) with a counter in one of `mine`.
fn folded_into(entry: &LedgerEntry, mine: &BTreeSet<u16>) -> bool {
    !entry.folded.is_empty()
        && entry
            .counters
            .iter()
            .any(|c| keys::shard_of(&c.key).is_some_and(|shard| mine.contains(&shard)))
}

fn shard_of_item(item: &StateItem) -> Option<u16> {
    match item {
        StateItem::Counter { key, .. } | StateItem::Record { key, .. } => keys::shard_of(key),
        StateItem::IndexedHold { index_key, .. } => keys::shard_of(index_key),
    }
}

/// Writes each shard's `items` into Redis and opens it (see [`Recovery::reopen_shards`]); the
/// shards opened, in order, and the items written into them.
async fn write_shards(
    shards: &Arc<dyn ShardStates>,
    token: &str,
    by_shard: BTreeMap<u16, Vec<StateItem>>,
    action: Option<&Action>,
    now_ms: i64,
) -> Result<(Vec<u16>, usize), EngineError> {
    let (mut opened, mut written_items) = (Vec::new(), 0);
    // A few shards at once (each one's calls in order, its last opening it): under load a
    // call waits its turn behind the requests Redis serves, so calls in sequence would
    // keep the shards closed that many turns; more at once, and the last of them would
    // wait past the Redis timeout.
    let mut writes = tokio::task::JoinSet::new();
    let mut done = Vec::new();
    for (shard, items) in by_shard {
        if writes.len() >= WRITES_AT_ONCE {
            done.extend(writes.join_next().await);
        }
        let (shards, token) = (shards.clone(), token.to_owned());
        // The index of open holds is written anew, unless other actions' holds are in it.
        let clear = action.is_none();
        writes.spawn(async move {
            let cleared = !clear || shards.clear_holds_index(shard, &token, LOCK_TTL_MS).await?;
            let written = cleared
                && shards
                    .write_shard(shard, &token, LOCK_TTL_MS, now_ms, &items, true)
                    .await?;
            Ok::<_, StoreError>((shard, written, items.len()))
        });
    }
    while let Some(result) = writes.join_next().await {
        done.push(result);
    }
    for result in done {
        let result = result.map_err(|e| StoreError::Protocol(format!("a shard's write: {e}")));
        let (shard, written, items) = result??;
        if written {
            opened.push(shard);
            written_items += items;
        } else {
            tracing::warn!(
                shard,
                "lost the lock of a shard's rebuild; another instance rebuilds it"
            );
        }
    }
    opened.sort_unstable();
    Ok((opened, written_items))
}

/// Extends `token`'s locks on `shards` every [`LOCK_KEEP_EVERY`] until dropped.
struct LockKeeper(tokio::task::JoinHandle<()>);

impl Drop for LockKeeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Recovery {
    /// Closes every one of `shards` and rebuilds them from the ledger (`counters rebuild`),
    /// from the last of `checkpoints` when there is one. Decisions meanwhile wait for it
    /// (503, or degraded under `allow`). With `action`, only that action's counters, holds,
    /// kept answers and refunded totals are replayed and written (its subjects spread over
    /// every shard, so every shard closes for the time it takes); the other actions' keys
    /// are left as they are.
    pub(crate) async fn rebuild_shards(
        &self,
        shards: &Arc<dyn ShardStates>,
        checkpoints: &dyn SnapshotStore,
        action: Option<&Action>,
    ) -> anyhow::Result<Reopened> {
        let all: Vec<u16> = (0..keys::SHARDS).collect();
        shards.close_shards(&all).await.map_err(EngineError::from)?;
        // Instances that serve may take some shards' locks first: wait for them too (a lock
        // whose instance died expires, and this call takes the shard over).
        let mut reopened = Reopened::default();
        let started = std::time::Instant::now();
        loop {
            let more = self.reopen_shards(shards, checkpoints, action).await?;
            reopened.shards.extend(more.shards);
            reopened.entries += more.entries;
            reopened.items += more.items;
            reopened.replay += more.replay;
            reopened.write += more.write;
            let closed = shards.closed_shards().await.map_err(EngineError::from)?;
            if closed.is_empty() {
                return Ok(reopened);
            }
            if started.elapsed() > REBUILD_WAIT {
                anyhow::bail!("{} shards are still being rebuilt", closed.len());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Rebuilds the `shards` that have no epoch and that no other instance is rebuilding,
    /// then opens them (with `action`, from that action's entries only; from the last of
    /// `checkpoints` when there is one). Nothing to do when every shard is open.
    pub(crate) async fn reopen_shards(
        &self,
        shards: &Arc<dyn ShardStates>,
        checkpoints: &dyn SnapshotStore,
        action: Option<&Action>,
    ) -> Result<Reopened, EngineError> {
        let _one_at_a_time = self.reopening.lock().await;
        let closed = shards.closed_shards().await?;
        if closed.is_empty() {
            return Ok(Reopened::default());
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut mine = BTreeSet::new();
        for shard in closed {
            if shards.lock_shard(shard, &token, LOCK_TTL_MS).await? {
                mine.insert(shard);
            }
        }
        if mine.is_empty() {
            return Ok(Reopened::default());
        }
        let _keeper = self.keep_locks(shards.clone(), &mine, &token);
        // Every entry Redis still holds goes to SQL first: the replay reads SQL. That
        // includes those another instance's drain has read and is writing now. With budgets
        // shared by subjects, an entry that charged these shards may wait in any shard's
        // stream: then every stream is drained.
        let shared = self.cache.has_shared_budgets();
        if shared {
            // Its entry is then in a stream, drained below.
            self.decider.attempts_across_slots_settle().await;
        }
        let to_drain: BTreeSet<u16> = match shared {
            true => (0..keys::SHARDS).collect(),
            false => mine.clone(),
        };
        if !self.pipeline.durability().drain_shards(&to_drain).await {
            tracing::warn!(
                shards = mine.len(),
                "the ledger streams of shards to rebuild do not drain (is the ledger database down?); will retry"
            );
            return Err(EngineError::Store(StoreError::Unavailable(
                "the ledger streams of the shards to rebuild did not drain".to_owned(),
            )));
        }
        let store = (self.scratch)();
        let started = std::time::Instant::now();
        let rebuilt = self
            .replay_shards(store.as_ref(), checkpoints, action, shared, &mine)
            .await?;
        let replay = started.elapsed();
        let now_ms = self.now().timestamp_millis();
        // Every shard of `mine`, with or without items: writing it opens it.
        let mut by_shard: BTreeMap<u16, Vec<StateItem>> =
            mine.iter().map(|&shard| (shard, Vec::new())).collect();
        for item in store.dump(now_ms).await {
            if let Some(shard) = shard_of_item(&item).filter(|s| mine.contains(s)) {
                by_shard.entry(shard).or_default().push(item);
            }
        }
        let (opened, items) = write_shards(shards, &token, by_shard, action, now_ms).await?;
        Ok(Reopened {
            shards: opened,
            entries: rebuilt.entries,
            items,
            replay,
            write: started.elapsed().saturating_sub(replay),
        })
    }

    /// Replays into `store` (a fresh one) the ledger entries that charged `mine` (every
    /// entry when budgets are `shared` by subjects; only `action`'s when given), from the
    /// last checkpoint of the ledger's replay on when there is one.
    async fn replay_shards(
        &self,
        store: &dyn Replay,
        checkpoints: &dyn SnapshotStore,
        action: Option<&Action>,
        shared: bool,
        mine: &BTreeSet<u16>,
    ) -> Result<crate::engine::state::Rebuilt, EngineError> {
        // Not for one action's keys: the checkpoint holds every action's.
        let after = match action {
            None => self
                .load_usable(store, checkpoints)
                .await?
                .map(|(covered, _)| covered),
            Some(_) => None,
        };
        self.replay_ledger(store, after, None, &|entry: &LedgerEntry| {
            // A budget shared by subjects lives in a shard of its own, charged by entries
            // of every shard: then every entry is replayed (and only these shards' keys
            // written back).
            action.is_none_or(|action| entry.action == *action)
                && (shared
                    || mine.contains(&keys::shard(entry.action.as_str(), entry.subject.as_str()))
                    || folded_into(entry, mine))
        })
        .await
    }

    /// Rebuilds the closed shards if a decision found one since the last call (or `always`).
    pub(crate) async fn reopen_if_wanted(&self, always: bool) {
        let wanted = self.followups.take_rebuild_wanted();
        if !(wanted || always) {
            return;
        }
        match self.pipeline.durability().reopen(self, None).await {
            Ok(reopened) if !reopened.shards.is_empty() => tracing::info!(
                shards = reopened.shards.len(),
                entries = reopened.entries,
                items = reopened.items,
                replay_ms = reopened.replay.as_millis(),
                write_ms = reopened.write.as_millis(),
                "rebuilt counter-store shards from the ledger"
            ),
            Ok(_) => {}
            Err(error) => {
                // Try again at the next look.
                self.followups.want_rebuild();
                tracing::warn!(error = %error, "rebuilding counter-store shards failed; will retry");
            }
        }
    }

    fn keep_locks(
        &self,
        shards: Arc<dyn ShardStates>,
        mine: &BTreeSet<u16>,
        token: &str,
    ) -> LockKeeper {
        let (mine, token) = (mine.clone(), token.to_owned());
        let clock = self.clock.clone();
        LockKeeper(tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOCK_KEEP_EVERY).await;
                let now_ms = clock.now().timestamp_millis();
                for &shard in &mine {
                    // No items, not opened: only extends the lock (if still ours).
                    let _ = shards
                        .write_shard(shard, &token, LOCK_TTL_MS, now_ms, &[], false)
                        .await;
                }
            }
        }))
    }
}
