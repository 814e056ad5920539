//! The drain's moves of the consumes recorded in the ledger's totals (Redis): each shard's
//! hash of waiting consumes (`consume.lua`) is handed out whole (`move.lua`), folded into
//! a few rows (`engine::pipeline::fold`) whose ids its content names, inserted, and only
//! then deleted. A crash or a failure between the insert and the delete hands the same
//! content out again: its rows are the same rows, which the insert ignores. Nothing is
//! lost, nothing counted twice; no stream entry, no stream read and no row per consume.

use super::pass::shards_charged;
use super::Drainer;
use crate::domain::{EntryId, LedgerEntry};
use crate::engine::codec;
use crate::engine::pipeline::fold::fold_moved;
use crate::engine::pipeline::stream::Moving;
use crate::engine::store::StoreError;
use crate::keys::{ledger_stream, SHARDS};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A hand-out read: its content's id and the consumes' entries.
fn read_moving(shard: u16, moving: &Moving) -> anyhow::Result<(String, Vec<LedgerEntry>)> {
    let mut content = None;
    let mut entries = Vec::with_capacity(moving.fields.len());
    for (field, value) in &moving.fields {
        if field == "#" {
            content = Some(value.clone());
            continue;
        }
        let decoded = codec::decode_entries(value).map_err(|error| {
            anyhow::anyhow!("shard {shard}: a consume recorded in totals ({field}): {error}")
        })?;
        entries.extend(decoded);
    }
    let content =
        content.ok_or_else(|| anyhow::anyhow!("shard {shard}: consumes in totals, unnamed"))?;
    Ok((content, entries))
}

/// How often the background drain moves the consumes recorded in totals: the moves of
/// every shard due go into SQL in one transaction, one commit where a move per shard and
/// pass made up to 64. Well under the ledger's pacing threshold (`QUOTA_LEDGER_PACE_MS`,
/// 500 ms by default), which the moved consumes' lag counts towards. A drain asked to
/// move everything now (a rebuild, a graceful stop, `drain_now`) does not wait.
const MOVE_EVERY: Duration = Duration::from_millis(200);

/// The drain's moves to come: the shards that waiting consumes were reported in, and
/// when it last moved.
#[derive(Debug)]
pub(super) struct Moves {
    shards: AtomicU64,
    last: Mutex<Instant>,
}

impl Default for Moves {
    fn default() -> Self {
        Self {
            shards: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }
}

impl Moves {
    fn last(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether shards wait for a move that is due.
    pub(super) fn due(&self) -> bool {
        self.shards.load(Ordering::Acquire) != 0 && self.last().elapsed() >= MOVE_EVERY
    }
}

impl Drainer {
    /// Moves the consumes recorded in the totals that wait in `shards` (bits) into SQL,
    /// adding how many it moved to `moved`: now with `every_move`, else with the shards
    /// of earlier passes once [`MOVE_EVERY`] has passed since the last move.
    pub(super) async fn move_totals(
        &self,
        shards: u64,
        every_move: bool,
        moved: &mut usize,
    ) -> anyhow::Result<()> {
        self.moves.shards.fetch_or(shards, Ordering::AcqRel);
        if !every_move && self.moves.last().elapsed() < MOVE_EVERY {
            return Ok(());
        }
        *self.moves.last() = Instant::now();
        let mut round = self.moves.shards.swap(0, Ordering::AcqRel);
        // A move not ended before is handed out first: then the shard's waiting hash.
        for _ in 0..2 {
            if round == 0 {
                break;
            }
            match self.move_round(round, moved).await {
                Ok(again) => round = again,
                Err(error) => {
                    self.moves.shards.fetch_or(round, Ordering::AcqRel);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Hands out what waits in each of `shards` (bits), inserts it in one transaction,
    /// then ends each hand-out; returns the shards whose hand-out was a move not ended
    /// before (their waiting hash is behind it).
    async fn move_round(&self, shards: u64, moved: &mut usize) -> anyhow::Result<u64> {
        let (mut rows, mut made, mut ends) = (Vec::new(), Vec::new(), Vec::new());
        let mut floors: BTreeMap<u16, u64> = BTreeMap::new();
        let mut again = 0;
        for shard in (0..SHARDS).filter(|s| shards & (1 << s) != 0) {
            let Some(moving) = self.streams.move_totals(shard).await? else {
                continue;
            };
            if moving.resumed {
                again |= 1 << shard;
            }
            let (content, entries) = read_moving(shard, &moving)?;
            let id = EntryId::parse(&content)
                .map_err(|error| anyhow::anyhow!("shard {shard}: content id: {error}"))?;
            let floor = floors.entry(shard).or_default();
            *floor = (*floor).max(moving.generation);
            // Shared budgets of other shards that these consumes charged: their floors too.
            let stream = ledger_stream(&self.prefix, shard);
            for other in shards_charged(&stream, &entries) {
                if other != shard {
                    let other_stream = ledger_stream(&self.prefix, other);
                    if let Some(generation) = self.streams.generation(&other_stream).await? {
                        let floor = floors.entry(other).or_default();
                        *floor = (*floor).max(generation);
                    }
                }
            }
            made.extend(entries.iter().map(|e| e.at));
            rows.extend(fold_moved(entries, id));
            ends.push((shard, content));
        }
        if ends.is_empty() {
            return Ok(0);
        }
        if crate::engine::faults::fault!(self, "drain.move") {
            anyhow::bail!("failpoint drain.move: inserting the moved totals failed");
        }
        self.ledger.append(&rows).await?;
        let count = made.len();
        self.lag.observe_committed(made.into_iter());
        let floors: Vec<(u16, u64)> = floors.into_iter().collect();
        self.ledger
            .record_generations(&self.prefix, &floors)
            .await?;
        self.streams.raise_floors(&floors);
        if crate::engine::faults::fault!(self, "drain.moved") {
            anyhow::bail!("failpoint drain.moved: ending the move failed");
        }
        for (shard, content) in ends {
            self.streams.moved_totals(shard, &content).await?;
        }
        *moved += count;
        Ok(again)
    }

    /// Whether the consume whose allowed entry is `id` waits in the totals of `stream`'s
    /// shard (recorded in the ledger's totals, not moved yet).
    pub(crate) async fn in_totals(&self, stream: &str, id: &str) -> Result<bool, StoreError> {
        match crate::keys::shard_of(stream) {
            Some(shard) => self.streams.in_totals(shard, id).await,
            None => Ok(false),
        }
    }

    /// Whether no consume recorded in the totals waits in `shards` (every one moved into
    /// SQL, and its move ended); `None` if the store did not answer.
    pub(crate) async fn totals_moved(&self, shards: impl IntoIterator<Item = u16>) -> Option<bool> {
        for shard in shards {
            if self.streams.totals_len(shard).await.ok()? > 0 {
                return Some(false);
            }
        }
        Some(true)
    }
}
