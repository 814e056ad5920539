//! Recovery: the counters are a cache of the ledger, the book of record, and are rebuilt
//! from it ([`rebuild`]): at each start in process, from the last [`snapshot`] on; per
//! shard on Redis, when one lost its epoch ([`shards`]), from the last [`checkpoint`] on. [`verify`] compares the live
//! counters with the ledger (on Redis at one instant of every shard, [`cut`]). [`void`]
//! gives back what Redis applied of an attempt answered 503.

pub(crate) mod backtest;
pub(crate) mod checkpoint;
pub(crate) mod cut;
mod pages;
pub(crate) mod rebuild;
pub mod shards;
pub(crate) mod snapshot;
pub(crate) mod verify;
pub mod void;

use crate::domain::LedgerEntry;
use crate::engine::followup::Followup;
use crate::engine::store::CounterStore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What recovery follows up for the decision path: attempts in doubt, to void; shards
/// found without their epoch, to rebuild.
pub(crate) struct Followups {
    /// The counter store, whose clock and call timeout bound a doubt.
    counters: Arc<dyn CounterStore>,
    /// Attempts answered 503 that Redis may have decided, until voided.
    doubts: void::Doubts,
    /// Set when a decision found a shard without its epoch.
    rebuild_wanted: AtomicBool,
}

impl Followups {
    /// Nothing to follow up yet, on `counters`.
    pub(crate) fn new(counters: Arc<dyn CounterStore>) -> Self {
        Self {
            counters,
            doubts: void::Doubts::default(),
            rebuild_wanted: AtomicBool::new(false),
        }
    }

    /// Whether a rebuild was wanted since the last call (and no longer is).
    fn take_rebuild_wanted(&self) -> bool {
        self.rebuild_wanted.swap(false, Ordering::AcqRel)
    }
}

impl Followup for Followups {
    fn doubt(
        &self,
        entry: &LedgerEntry,
        stream: &str,
        idempotency: Option<String>,
        intent: Option<String>,
    ) {
        let timeout = self.counters.call_timeout();
        let now = self.counters.store_now_ms();
        self.doubts
            .push(entry, stream, (now, timeout), idempotency, intent);
    }

    fn want_rebuild(&self) {
        self.rebuild_wanted.store(true, Ordering::Release);
    }
}
