//! Snapshots of the in-process counter store, so that a start of the embedded default
//! replays only the ledger entries written after the last snapshot instead of the whole
//! horizon.
//!
//! Every few minutes, and at graceful shutdown (the HTTP server and the hold sweeper
//! stopped), `Engine::snapshot_now` takes the engine's `cut` lock alone: every change to
//! the store holds it (shared) from its store call until its ledger entry is committed, so
//! once it is taken, and the ledger writer flushed, the store's live state equals the
//! replay of every committed entry. The engine dumps that state as [`StateItem`]s through
//! the [`Replay`](crate::engine::state::Replay) port, lets changes resume, encodes the items with
//! `codec::snapshot` and saves them through the [`SnapshotStore`] port (the SQL ledger's
//! database), with the ledger `seq` they cover. At start, `Engine::restore` loads a
//! usable snapshot into the fresh store and replays the entries after it
//! ([`Engine::rebuild`](crate::engine::Engine) from that seq); otherwise it replays the whole
//! horizon.
//!
//! A snapshot is **unusable**, and the start replays the whole horizon instead (logging a
//! warning and deleting it, so that it can never match again later), when:
//! - its format version is not the one this build writes;
//! - it covers a `seq` beyond the ledger's highest (the ledger was restored from an older
//!   backup, or is another database);
//! - the ledger's entry at its covered `seq` has another id than the one it recorded
//!   (another ledger that happens to be as long);
//! - its counters were kept under another key prefix (`QUOTA_REDIS_PREFIX` changed);
//! - it was taken after now (the clock moved back: its state would be from the future);
//! - it was taken before the replay's horizon (the full replay then reads less);
//! - its parts are incomplete or do not decode.
//!
//! A kill -9 writes no snapshot: the next start loads the last one (periodic, or from an
//! earlier graceful stop) and replays everything after it, as exact as a full replay.

mod restore;

use crate::engine::ledger::LedgerError;
use crate::engine::state::{Rebuilt, Replay, StateItem};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// What a snapshot is taken through: the in-process store and the table it goes to.
#[derive(Clone)]
pub(crate) struct Snapshots {
    /// The store the engine decides with.
    pub(crate) store: Arc<dyn Replay>,
    /// Where snapshots are kept.
    pub(crate) table: Arc<dyn SnapshotStore>,
}

/// A snapshot as the [`SnapshotStore`] keeps it: a header and the encoded parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredSnapshot {
    /// The version of the parts' encoding (`codec::SNAPSHOT_FORMAT` when written).
    pub(crate) format: i32,
    /// The highest ledger `seq` whose entry the state includes; 0 for an empty ledger.
    pub(crate) covered_seq: i64,
    /// The id of the entry at `covered_seq` (`None` for an empty ledger).
    pub(crate) covered_id: Option<String>,
    /// The key prefix the counters were kept under.
    pub(crate) prefix: String,
    /// When it was taken, on the engine's clock.
    pub(crate) taken_at: DateTime<Utc>,
    /// The state items, encoded by `codec::encode_snapshot`, in order.
    pub(crate) parts: Vec<Vec<u8>>,
}

/// A checkpoint that holds only what changed since the one before it (`checkpoint`): the
/// state items of the keys that changed, and the keys that went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredDelta {
    /// The `covered_seq` of the full snapshot its chain starts from.
    pub(crate) base_seq: i64,
    /// The `covered_seq` of the checkpoint it follows (the snapshot's, or a delta's).
    pub(crate) after_seq: i64,
    /// Its header and parts (`codec::encode_delta`; `format` is `codec::DELTA_FORMAT`).
    pub(crate) snapshot: StoredSnapshot,
}

/// Where snapshots are kept: a table of the ledger's database (the SQL ledger adapter).
#[async_trait]
pub(crate) trait SnapshotStore: Send + Sync {
    /// Saves `snapshot` and deletes every older one and every delta, in one transaction.
    async fn save(&self, snapshot: &StoredSnapshot) -> Result<(), LedgerError>;
    /// Saves `delta` after the checkpoint it follows, in one transaction; `false`, saving
    /// nothing, when that is not the newest one kept (the kept snapshot is not its base,
    /// or the newest delta of that base is not `after_seq`).
    async fn save_delta(&self, delta: &StoredDelta) -> Result<bool, LedgerError>;
    /// The deltas saved after the snapshot covering `base_seq`, in the order they were
    /// saved (by `covered_seq`); those after a delta whose parts do not add up are left out.
    async fn deltas(&self, base_seq: i64) -> Result<Vec<StoredDelta>, LedgerError>;
    /// The snapshot kept, if any. Parts that do not form one whole snapshot (a part
    /// missing, headers that differ) are [`LedgerError::Corrupt`].
    async fn latest(&self) -> Result<Option<StoredSnapshot>, LedgerError>;
    /// The `seq` the newest checkpoint kept covers (the kept snapshot's, or its newest
    /// delta's), without reading its parts.
    async fn latest_covered(&self) -> Result<Option<i64>, LedgerError>;
    /// Deletes every snapshot and delta.
    async fn delete_all(&self) -> Result<(), LedgerError>;
    /// The ledger's highest `seq` and the id of its entry; `None` for an empty ledger.
    async fn last_entry(&self) -> Result<Option<(i64, String)>, LedgerError>;
    /// The id of the ledger entry numbered `seq`, if it is still there.
    async fn entry_id_at(&self, seq: i64) -> Result<Option<String>, LedgerError>;
}

/// What a start did to rebuild the in-process counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// The ledger `seq` covered by the snapshot loaded; `None` when none was (a full
    /// replay of the horizon).
    pub snapshot_seq: Option<i64>,
    /// State items loaded from the snapshot.
    pub loaded: usize,
    /// Ledger entries read and replayed after the snapshot (or in the horizon).
    pub entries: usize,
    /// Steps replayed.
    pub steps: usize,
}

impl Restored {
    /// A full replay's outcome.
    fn replayed(rebuilt: Rebuilt) -> Self {
        Self {
            snapshot_seq: None,
            loaded: 0,
            entries: rebuilt.entries,
            steps: rebuilt.steps,
        }
    }
}

/// What a snapshot saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// The ledger `seq` it covers.
    pub covered_seq: i64,
    /// State items in it.
    pub items: usize,
    /// Encoded bytes, all parts together.
    pub bytes: usize,
    /// How long changes to the counters were held back: from waiting for the cut lock
    /// (the changes under way committing) to the end of the copy.
    pub paused: std::time::Duration,
    /// Whether only what changed since the checkpoint before was saved (a delta): then
    /// `items` and `bytes` are the delta's.
    pub delta: bool,
}
