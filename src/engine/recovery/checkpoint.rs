//! Checkpoints of the ledger's replay (Redis mode), so that rebuilding a shard whose Redis
//! data was lost reads the ledger entries after the last checkpoint, not the whole horizon.
//!
//! A checkpoint is the state a replay of the ledger up to one `seq` gives (usage, open
//! holds, kept answers, refunded totals), saved in the snapshot table
//! (`counter_snapshots`, the embedded default's snapshots, same format and same rules of
//! use): it is derived from SQL alone, the book of record, never read from Redis. The
//! janitor keeps it every `QUOTA_CHECKPOINT_EVERY_S` (10 s by default): it replays the
//! entries committed since the last checkpoint into the state it keeps in memory (loaded
//! from the table when it has none, or another instance saved a newer one), up to the last
//! entry that was committed [`SETTLE`] earlier, and saves the new state. Appends may run
//! several at a time on Postgres, and one commit higher `seq`s before another commits lower
//! ones: the checkpoint first waits until that `seq` is settled (`LedgerStore::
//! settled_seq`: no append in flight holds a lower one), so the entries up to it are a
//! prefix that no later commit changes.
//!
//! A checkpoint saves only what changed since the one before it ([`delta`]), after a first
//! full snapshot: each key whose items changed, and the keys that went. The deltas follow
//! the snapshot in `counter_snapshot_deltas`; after [`delta::MAX_DELTAS`] of them, or once
//! they weigh as much as the snapshot, the next checkpoint saves the whole state again
//! (which deletes them). An instance that did not save the newest checkpoint (another one
//! did, or it just became the janitor) saves a full one.
//!
//! A rebuild (`shards`) loads the checkpoint (the snapshot, then its deltas in order) into
//! its scratch store and replays only the
//! entries after it. The entries after it are replayed by the time they were made, as a
//! full replay does, but not before those the checkpoint covers: an entry inserted more
//! than [`SETTLE`] after it was made (its drain failed or its instance died) and made
//! before the checkpoint's last entries is replayed after them, as a full replay does for
//! entries inserted more than `REORDER` apart. Counts by period, bucket or lifetime come
//! out the same; a token bucket may count it a little later (a little more used).

pub(in crate::engine) mod delta;

use super::snapshot::{Saved, SnapshotStore, StoredDelta, StoredSnapshot};
use crate::engine::codec;
use crate::engine::recovery::Recovery;
use crate::engine::state::{Replay, StateItem};
use crate::engine::EngineError;
use delta::Chain;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the janitor notes the ledger's last entry, so that a checkpoint covers the
/// entries committed up to [`SETTLE`] before it, not before the previous checkpoint.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long after its commit an entry is taken into a checkpoint: the entries made before
/// it that waited in a stream meanwhile (the drain's normal lag, under a second) are in SQL
/// by then.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// The state the janitor keeps between two checkpoints: a replay of the ledger up to
/// `covered`, and what it saw of the ledger's last entry, to choose the next `seq`.
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// The replayed state and the `seq` it covers, once there is one.
    state: Option<(Arc<dyn Replay>, i64)>,
    /// The ledger's last entry (`seq`, id) as seen at each look, oldest first, for
    /// [`SETTLE`].
    seen: VecDeque<(Instant, i64, String)>,
    /// What this instance saved last, which a delta may follow.
    chain: Option<Chain>,
}

impl Checkpoints {
    /// Notes the ledger's last entry now; returns the last one seen at least [`SETTLE`]
    /// ago, which every entry up to it was committed before.
    fn settled(&mut self, now: Instant, last: Option<(i64, String)>) -> Option<(i64, String)> {
        if let Some((seq, id)) = last {
            self.seen.push_back((now, seq, id));
        }
        let old = |at: &Instant| now.duration_since(*at) >= SETTLE;
        // Keep the newest of those old enough at the front.
        while self.seen.get(1).is_some_and(|(at, _, _)| old(at)) {
            self.seen.pop_front();
        }
        self.seen
            .front()
            .filter(|(at, _, _)| old(at))
            .map(|(_, seq, id)| (*seq, id.clone()))
    }
}

impl Recovery {
    /// Notes the ledger's last entry (the janitor looks every [`LOOK_EVERY`]) and, when
    /// `due` (every `QUOTA_CHECKPOINT_EVERY_S`), checkpoints the ledger up to its last
    /// entry committed [`SETTLE`] ago (see the module doc); what was saved, `None` when
    /// nothing was due or new. `table` keeps them.
    pub(crate) async fn checkpoint_settled(
        &self,
        table: &dyn SnapshotStore,
        checkpoints: &mut Checkpoints,
        due: bool,
    ) -> Result<Option<Saved>, EngineError> {
        let last = table.last_entry().await?;
        let settled = checkpoints.settled(Instant::now(), last);
        let (true, Some(until)) = (due, settled) else {
            return Ok(None);
        };
        self.checkpoint_until(checkpoints, table, until).await
    }

    /// Checkpoints every entry committed so far into `table` (tests, and an operator's
    /// rebuild).
    pub(crate) async fn checkpoint_now_in(
        &self,
        table: &dyn SnapshotStore,
    ) -> anyhow::Result<Option<Saved>> {
        let Some(until) = table.last_entry().await.map_err(EngineError::from)? else {
            return Ok(None);
        };
        let mut checkpoints = Checkpoints::default();
        Ok(self
            .checkpoint_until(&mut checkpoints, table, until)
            .await?)
    }

    /// Replays the entries after the kept (or saved) checkpoint up to `until` into it,
    /// and saves it as covering `until`.
    async fn checkpoint_until(
        &self,
        checkpoints: &mut Checkpoints,
        table: &dyn SnapshotStore,
        (until, until_id): (i64, String),
    ) -> Result<Option<Saved>, EngineError> {
        let started = Instant::now();
        let saved_seq = table.latest_covered().await?;
        let (store, covered) = match checkpoints.state.take() {
            // Ours is the newest: go on from it.
            Some((store, covered)) if saved_seq.is_none_or(|saved| saved <= covered) => {
                (store, Some(covered))
            }
            // Another instance saved a newer one, or this one has none yet.
            _ => {
                checkpoints.chain = None;
                let store = (self.scratch)();
                let loaded = self.load_usable(store.as_ref(), table).await?;
                let covered = loaded.map(|(covered, _)| covered);
                (store, covered)
            }
        };
        // A delta follows the newest checkpoint kept, which must be the one this instance
        // saved (the state it goes on from).
        if saved_seq != checkpoints.chain.as_ref().map(|c| c.head_seq) {
            checkpoints.chain = None;
        }
        if covered.is_some_and(|covered| covered >= until) {
            checkpoints.state = covered.map(|covered| (store, covered));
            return Ok(None);
        }
        // Every entry up to `until` is in: no append in flight holds a lower `seq`.
        if self
            .ledger
            .settled_seq()
            .await?
            .is_none_or(|settled| settled < until)
        {
            checkpoints.state = covered.map(|covered| (store, covered));
            return Ok(None);
        }
        let rebuilt = self
            .replay_ledger(store.as_ref(), covered, Some(until), &|_| true)
            .await?;
        let replayed = started.elapsed();
        let taken_at = self.now();
        let items = store.dump(taken_at.timestamp_millis()).await;
        let header = StoredSnapshot {
            format: codec::SNAPSHOT_FORMAT,
            covered_seq: until,
            covered_id: Some(until_id),
            prefix: self.prefix.clone(),
            taken_at,
            parts: Vec::new(),
        };
        let saved = save(checkpoints, table, &items, covered, header).await?;
        drop(items);
        checkpoints.state = Some((store, until));
        tracing::info!(
            covered_seq = until,
            entries = rebuilt.entries,
            items = saved.items,
            bytes = saved.bytes,
            delta = saved.delta,
            replay_ms = replayed.as_millis(),
            millis = started.elapsed().as_millis(),
            "saved a checkpoint of the ledger's replay"
        );
        Ok(Some(saved))
    }
}

/// Saves the state `items` a replay gave from `covered` on, as `header` says: a delta
/// when it follows the newest checkpoint this instance saved (and that one is still the
/// newest kept), else the whole state, which starts a new chain.
async fn save(
    checkpoints: &mut Checkpoints,
    table: &dyn SnapshotStore,
    items: &[StateItem],
    covered: Option<i64>,
    mut header: StoredSnapshot,
) -> Result<Saved, EngineError> {
    let until = header.covered_seq;
    let prints = delta::prints(items);
    if let Some(chain) = checkpoints.chain.as_mut().filter(|c| c.extends(covered)) {
        let (changed, gone) = chain.diff(items, &prints);
        let delta = StoredDelta {
            base_seq: chain.base_seq,
            after_seq: chain.head_seq,
            snapshot: StoredSnapshot {
                format: codec::DELTA_FORMAT,
                parts: codec::encode_delta(&changed, &gone),
                ..header.clone()
            },
        };
        let bytes = delta.snapshot.parts.iter().map(Vec::len).sum();
        if table.save_delta(&delta).await? {
            chain.extended(until, bytes, prints);
            return Ok(Saved {
                covered_seq: until,
                items: changed.len() + gone.len(),
                bytes,
                paused: Duration::ZERO,
                delta: true,
            });
        }
    }
    header.parts = codec::encode_snapshot(items);
    let bytes = header.parts.iter().map(Vec::len).sum();
    table.save(&header).await?;
    checkpoints.chain = Some(Chain::started(until, bytes, prints));
    Ok(Saved {
        covered_seq: until,
        items: items.len(),
        bytes,
        paused: Duration::ZERO,
        delta: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: i64) -> Option<(i64, String)> {
        Some((seq, format!("e{seq}")))
    }

    #[test]
    fn a_checkpoint_covers_the_last_entry_seen_at_least_settle_ago() {
        let mut checkpoints = Checkpoints::default();
        let t0 = Instant::now();
        let at = |halves: u32| t0 + SETTLE * halves / 2;
        assert_eq!(
            checkpoints.settled(at(0), entry(5)),
            None,
            "nothing is settled yet"
        );
        assert_eq!(checkpoints.settled(at(1), entry(7)), None);
        assert_eq!(checkpoints.settled(at(2), entry(9)), entry(5));
        // Seen at 1 and 2 are both settled at 4: the newer, 9 (seen at 2), is taken.
        assert_eq!(checkpoints.settled(at(4), entry(12)), entry(9));
        // An empty look changes nothing but the time.
        assert_eq!(checkpoints.settled(at(6), None), entry(12));
        assert_eq!(checkpoints.settled(at(7), None), entry(12));
    }
}
