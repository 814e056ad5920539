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

impl Drainer {
    /// Moves the consumes recorded in the totals that wait in `shards` (bits) into SQL,
    /// adding how many it moved to `moved`.
    pub(super) async fn move_totals(&self, shards: u64, moved: &mut usize) -> anyhow::Result<()> {
        // A move not ended before is handed out first: then the shard's waiting hash.
        let twice = (0..SHARDS)
            .filter(|s| shards & (1 << s) != 0)
            .flat_map(|shard| [shard, shard]);
        let mut done = 0u64;
        for shard in twice {
            if done & (1 << shard) != 0 {
                continue;
            }
            let Some(moving) = self.streams.move_totals(shard).await? else {
                done |= 1 << shard;
                continue;
            };
            let (content, entries) = read_moving(shard, &moving)?;
            let id = EntryId::parse(&content)
                .map_err(|error| anyhow::anyhow!("shard {shard}: content id: {error}"))?;
            let count = entries.len();
            let stream = ledger_stream(&self.prefix, shard);
            // Shared budgets of other shards that these consumes charged: their floors too.
            let mut floors = vec![(shard, moving.generation)];
            for other in shards_charged(&stream, &entries) {
                if other != shard {
                    let other_stream = ledger_stream(&self.prefix, other);
                    if let Some(generation) = self.streams.generation(&other_stream).await? {
                        floors.push((other, generation));
                    }
                }
            }
            let made: Vec<_> = entries.iter().map(|e| e.at).collect();
            let rows = fold_moved(entries, id);
            if crate::engine::faults::fault!(self, "drain.move") {
                anyhow::bail!("failpoint drain.move: inserting the moved totals failed");
            }
            self.ledger.append(&rows).await?;
            self.lag.observe_committed(made.into_iter());
            self.ledger
                .record_generations(&self.prefix, &floors)
                .await?;
            self.streams.raise_floors(&floors);
            if crate::engine::faults::fault!(self, "drain.moved") {
                anyhow::bail!("failpoint drain.moved: ending the move failed");
            }
            self.streams.moved_totals(shard, &content).await?;
            *moved += count;
        }
        Ok(())
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
