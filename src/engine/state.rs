//! What a counter store's state is made of, as replays and snapshots see it: the steps a
//! replay applies ([`ReplayOp`]), the items a dump or a snapshot holds ([`StateItem`]), and
//! the [`Replay`] port of a store that takes both. `rebuild` replays the ledger into such a
//! store, `snapshot` saves and loads its items: both depend on this module, not on each
//! other.

use super::store::{Charge, CounterStore, GiveBack, StoreError};
use async_trait::async_trait;
use std::sync::Arc;

/// The state of one counter, one variant per algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CounterState {
    /// A calendar period: the units used in it.
    Calendar {
        /// Units used.
        used: u64,
    },
    /// A rolling window: (bucket index, units), ascending by index.
    Rolling {
        /// The buckets held.
        buckets: Vec<(i64, u64)>,
    },
    /// A token bucket (GCRA): `s` = used × period_ms as of time `t_ms`.
    TokenBucket {
        /// Used × period, in unit-milliseconds.
        s: u64,
        /// When `s` was last brought up to date, Unix ms.
        t_ms: i64,
    },
}

/// One piece of a counter store's live state, as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StateItem {
    /// A counter and when it is dropped.
    Counter {
        /// The counter's key.
        key: String,
        /// Last millisecond at which it exists.
        expires_at_ms: i64,
        /// What it counts.
        state: CounterState,
    },
    /// A record (a kept answer, a hold's record, a refunded total) and when it is dropped.
    Record {
        /// The record's key.
        key: String,
        /// The text as the store keeps it.
        text: String,
        /// Last millisecond at which it exists.
        expires_at_ms: i64,
    },
    /// An open hold in its shard's index, by expiry (indexes themselves never expire).
    IndexedHold {
        /// The shard's index of open holds.
        index_key: String,
        /// The hold id.
        hold_id: String,
        /// When the hold expires, Unix ms (its score in the index).
        expires_at_ms: i64,
    },
}

/// One step of history, as a counter store applies it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplayOp {
    /// Puts each charge's cost on its counter at `at_ms`, whatever the limit: the charge
    /// was allowed when it was made.
    Charge {
        /// When it was charged, Unix ms.
        at_ms: i64,
        /// The counters, as one decision charged them (one hash tag).
        charges: Vec<Charge>,
    },
    /// Gives back at `at_ms` as a refund, settlement or expiry did.
    GiveBack {
        /// When, Unix ms.
        at_ms: i64,
        /// The request, as the engine made it then (boxed: it is much larger than the
        /// other steps).
        request: Box<GiveBack>,
    },
    /// Keeps `text` at `key` until `expires_at_ms`: a hold's record, or a kept answer.
    Record {
        /// The key.
        key: String,
        /// The text, as the store keeps it.
        text: String,
        /// When the store lets it go, Unix ms.
        expires_at_ms: i64,
    },
    /// Indexes an open hold by its expiry, for the sweeper.
    IndexHold {
        /// The shard's index of open holds.
        index_key: String,
        /// The hold id.
        hold_id: String,
        /// When it expires, Unix ms.
        expires_at_ms: i64,
    },
}

/// A counter store that history can be replayed into, and whose state can be dumped and
/// loaded again (snapshots). Its records are read through [`CounterStore::record`].
#[async_trait]
pub(crate) trait Replay: CounterStore {
    /// Applies `ops` in order.
    async fn replay(&self, ops: Vec<ReplayOp>) -> Result<(), StoreError>;
    /// Everything the store holds that is live at `now_ms`. Call it while nothing changes
    /// the store (the engine holds its `cut` lock alone): each shard is copied under its
    /// lock, but not all at once.
    async fn dump(&self, now_ms: i64) -> Vec<StateItem>;
    /// Puts `items` into the store (a fresh one), dropping those already gone at
    /// `taken_at_ms`, the snapshot's time; returns how many it kept. Items that expired
    /// later, while the service was down, are kept: entries replayed after the snapshot
    /// are applied at their own times, when those items still counted, and every call
    /// at a later time sees them gone (expiry is by the `now_ms` of the calls).
    async fn load(&self, items: Vec<StateItem>, taken_at_ms: i64) -> usize;
}

/// What a rebuild did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rebuilt {
    /// Ledger entries read.
    pub(crate) entries: usize,
    /// Steps replayed.
    pub(crate) steps: usize,
}

/// A fresh, empty in-process store to replay a shard's ledger into.
pub(crate) type ScratchStore = Arc<dyn Fn() -> Arc<dyn Replay> + Send + Sync>;
