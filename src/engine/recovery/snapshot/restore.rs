//! Taking a snapshot at graceful shutdown, and at start loading it (when it is usable)
//! before replaying the ledger entries after it.

use super::{Restored, Saved, SnapshotStore, StateItem, StoredSnapshot};
use crate::engine::codec;
use crate::engine::ledger::LedgerError;
use crate::engine::recovery::checkpoint::delta::apply as apply_delta;
use crate::engine::recovery::rebuild::horizon;
use crate::engine::recovery::Recovery;
use crate::engine::state::Replay;
use crate::engine::EngineError;
use chrono::{DateTime, Utc};

/// Why a snapshot is not used (see the module doc of `engine::snapshot`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unusable {
    /// Written in a format this build does not read.
    #[error("its format {0} is not the one this build reads")]
    UnknownFormat(i32),
    /// It covers entries the ledger does not have.
    #[error("it covers ledger seq {covered}, beyond the ledger's highest, {last}")]
    BeyondLedger {
        /// The seq it covers.
        covered: i64,
        /// The ledger's highest seq (0 when empty).
        last: i64,
    },
    /// The ledger's entry at the covered seq is not the one it covered.
    #[error("the ledger's entry at seq {0} is not the one it covered: another ledger")]
    OtherLedger(i64),
    /// Its keys start with another prefix.
    #[error("its counters were kept under another key prefix, {0:?}")]
    OtherPrefix(String),
    /// Taken after now.
    #[error("it was taken at {0}, after now: the clock moved back")]
    FromTheFuture(DateTime<Utc>),
    /// Taken before the replay's horizon.
    #[error("it was taken at {0}, before the horizon of the replay")]
    TooOld(DateTime<Utc>),
    /// Its parts are incomplete or do not decode.
    #[error("it does not read: {0}")]
    Corrupt(String),
}

impl Recovery {
    /// Snapshots the in-process store of `snapshots` into its table, replacing the
    /// snapshot kept, unless the ledger's last entry is still the one numbered `covered`
    /// (the snapshot kept covers it: the state it holds is the same); what was saved.
    ///
    /// Safe while requests flow: it waits for the changes under way to commit their ledger
    /// entries and holds new ones back (the `cut` lock) while it copies the store, so the
    /// copy equals the replay of every entry up to the ledger's last. Encoding and saving
    /// happen after traffic resumed. A failure is logged, never fatal: the next start
    /// then replays from the previous snapshot, or the horizon.
    pub(crate) async fn snapshot_into(
        &self,
        snapshots: &super::Snapshots,
        covered: Option<i64>,
    ) -> Option<Saved> {
        let started = std::time::Instant::now();
        match self
            .save_snapshot(snapshots.store.as_ref(), snapshots.table.as_ref(), covered)
            .await
        {
            Ok(None) => None,
            Ok(Some(saved)) => {
                tracing::info!(
                    covered_seq = saved.covered_seq,
                    items = saved.items,
                    bytes = saved.bytes,
                    paused_ms = saved.paused.as_millis(),
                    millis = started.elapsed().as_millis(),
                    "saved a snapshot of the in-process counters"
                );
                Some(saved)
            }
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "saving a snapshot of the in-process counters failed; the next start \
                     replays the ledger after the previous one"
                );
                None
            }
        }
    }

    /// Snapshots `source` into `store` (see [`Recovery::snapshot_into`]).
    async fn save_snapshot(
        &self,
        source: &dyn Replay,
        store: &dyn SnapshotStore,
        unless_covered: Option<i64>,
    ) -> Result<Option<Saved>, EngineError> {
        let pause = std::time::Instant::now();
        let paused = self.pipeline.pause().await?;
        let last = store.last_entry().await?;
        if let Some(covered) = unless_covered {
            if last.as_ref().map_or(0, |(seq, _)| *seq) == covered {
                return Ok(None);
            }
        }
        let taken_at = self.now();
        let items = source.dump(taken_at.timestamp_millis()).await;
        drop(paused);
        let paused = pause.elapsed();
        let parts = codec::encode_snapshot(&items);
        let (covered_seq, covered_id) = match last {
            Some((seq, id)) => (seq, Some(id)),
            None => (0, None),
        };
        let saved = Saved {
            covered_seq,
            items: items.len(),
            bytes: parts.iter().map(Vec::len).sum(),
            paused,
            delta: false,
        };
        drop(items);
        if crate::engine::faults::fault!(self, "snapshot.save") {
            return Err(EngineError::from(
                crate::engine::ledger::LedgerError::unavailable(std::io::Error::other(
                    "failpoint snapshot.save: saving the snapshot failed",
                )),
            ));
        }
        let snapshot = StoredSnapshot {
            format: codec::SNAPSHOT_FORMAT,
            covered_seq,
            covered_id,
            prefix: self.prefix.clone(),
            taken_at,
            parts,
        };
        store.save(&snapshot).await?;
        Ok(Some(saved))
    }

    /// Rebuilds `target`, a fresh in-process store: from the snapshot `store` keeps and the
    /// ledger entries after it when the snapshot is usable, else from the whole horizon of
    /// the ledger (an unusable snapshot is logged and deleted).
    pub(crate) async fn restore(
        &self,
        target: &dyn Replay,
        store: &dyn SnapshotStore,
    ) -> Result<Restored, EngineError> {
        let loaded = self.load_usable(target, store).await?;
        let rebuilt = self
            .rebuild(target, loaded.map(|(covered, _)| covered))
            .await?;
        Ok(match loaded {
            Some((covered, loaded)) => Restored {
                snapshot_seq: Some(covered),
                loaded,
                entries: rebuilt.entries,
                steps: rebuilt.steps,
            },
            None => Restored::replayed(rebuilt),
        })
    }

    /// Loads the snapshot `store` keeps into `target` (a fresh store) if it is usable: the
    /// `seq` it covers and the items loaded; `None` when there is none, or it was unusable
    /// (then logged and deleted, so that it can never match again). The embedded default's
    /// start and a rebuild from a ledger checkpoint (`checkpoint`) both start from it.
    pub(in crate::engine) async fn load_usable(
        &self,
        target: &dyn Replay,
        store: &dyn SnapshotStore,
    ) -> Result<Option<(i64, usize)>, EngineError> {
        let usable = match store.latest().await {
            Ok(None) => return Ok(None),
            Ok(Some(snapshot)) => match self.usable(&snapshot, store).await? {
                Ok(items) => Ok(self.with_deltas(&snapshot, items, store).await?),
                Err(why) => Err(why),
            },
            Err(LedgerError::Corrupt(why)) => Err(Unusable::Corrupt(why)),
            Err(error) => return Err(error.into()),
        };
        match usable {
            Ok((covered, taken_at, items)) => {
                let loaded = target.load(items, taken_at.timestamp_millis()).await;
                Ok(Some((covered, loaded)))
            }
            Err(why) => {
                tracing::warn!(
                    reason = %why,
                    "the counter snapshot is unusable: deleting it and replaying the ledger's \
                     whole horizon instead"
                );
                store.delete_all().await?;
                Ok(None)
            }
        }
    }

    /// `items`, those of the usable `snapshot`, with the deltas saved after it applied in
    /// order (`checkpoint`), as far as each is usable as the snapshot is: the `seq` the
    /// state then covers, when it was taken, and its items. A delta that is not (another
    /// format or prefix, beyond the ledger, from the future, unreadable) ends the chain
    /// there, logged: the replay reads the ledger after the last one applied.
    async fn with_deltas(
        &self,
        snapshot: &StoredSnapshot,
        mut items: Vec<StateItem>,
        store: &dyn SnapshotStore,
    ) -> Result<(i64, DateTime<Utc>, Vec<StateItem>), EngineError> {
        let (mut covered, mut taken_at) = (snapshot.covered_seq, snapshot.taken_at);
        let deltas = store.deltas(covered).await?;
        if deltas.is_empty() {
            return Ok((covered, taken_at, items));
        }
        let now = self.now();
        let last = store.last_entry().await?.map_or(0, |(seq, _)| seq);
        for delta in deltas {
            // Another chain's (two instances saved after the same checkpoint): not ours.
            if delta.after_seq != covered {
                continue;
            }
            let header = &delta.snapshot;
            let unusable = if header.format != codec::DELTA_FORMAT {
                Some(Unusable::UnknownFormat(header.format))
            } else if header.prefix != self.prefix {
                Some(Unusable::OtherPrefix(header.prefix.clone()))
            } else if header.taken_at > now || header.taken_at < taken_at {
                Some(Unusable::FromTheFuture(header.taken_at))
            } else if header.covered_seq > last {
                Some(Unusable::BeyondLedger {
                    covered: header.covered_seq,
                    last,
                })
            } else {
                None
            };
            let unusable = match (unusable, &header.covered_id) {
                (None, Some(id)) => store
                    .entry_id_at(header.covered_seq)
                    .await?
                    .filter(|found| found != id)
                    .map(|_| Unusable::OtherLedger(header.covered_seq)),
                (unusable, _) => unusable,
            };
            let decoded = match unusable {
                Some(why) => Err(why),
                None => codec::decode_delta(&header.parts)
                    .map_err(|error| Unusable::Corrupt(error.to_string())),
            };
            match decoded {
                Ok(delta) => {
                    items = apply_delta(items, delta);
                    (covered, taken_at) = (header.covered_seq, header.taken_at);
                }
                Err(why) => {
                    tracing::warn!(
                        reason = %why,
                        covered_seq = covered,
                        "a delta of the ledger's checkpoint is unusable: the replay reads the \
                         ledger after the last checkpoint applied"
                    );
                    break;
                }
            }
        }
        Ok((covered, taken_at, items))
    }

    /// The items of `snapshot` if it may be loaded, else why not.
    pub(in crate::engine) async fn usable(
        &self,
        snapshot: &StoredSnapshot,
        store: &dyn SnapshotStore,
    ) -> Result<Result<Vec<StateItem>, Unusable>, EngineError> {
        let now = self.now();
        let unusable = if snapshot.format != codec::SNAPSHOT_FORMAT {
            Some(Unusable::UnknownFormat(snapshot.format))
        } else if snapshot.prefix != self.prefix {
            Some(Unusable::OtherPrefix(snapshot.prefix.clone()))
        } else if snapshot.taken_at > now {
            Some(Unusable::FromTheFuture(snapshot.taken_at))
        } else if snapshot.taken_at < now - horizon(&self.cache.windows()) {
            Some(Unusable::TooOld(snapshot.taken_at))
        } else {
            None
        };
        if let Some(why) = unusable {
            return Ok(Err(why));
        }
        let last = store.last_entry().await?.map_or(0, |(seq, _)| seq);
        if snapshot.covered_seq > last {
            return Ok(Err(Unusable::BeyondLedger {
                covered: snapshot.covered_seq,
                last,
            }));
        }
        if let Some(covered_id) = &snapshot.covered_id {
            // Retention may have deleted the entry since: then there is nothing to compare.
            let found = store.entry_id_at(snapshot.covered_seq).await?;
            if found.is_some_and(|id| id != *covered_id) {
                return Ok(Err(Unusable::OtherLedger(snapshot.covered_seq)));
            }
        }
        Ok(codec::decode_snapshot(&snapshot.parts).map_err(|e| Unusable::Corrupt(e.to_string())))
    }
}
