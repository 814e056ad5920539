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

use crate::clock::Clock;
use crate::domain::LedgerEntry;
use crate::engine::decision::policies::PolicyCache;
use crate::engine::decision::Decider;
use crate::engine::followup::Followup;
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerStore;
use crate::engine::pipeline::Pipeline;
use crate::engine::state::ScratchStore;
use crate::engine::store::{CounterStore, StoreError};
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Recovery, a part of the engine of its own: it rebuilds the counters from the ledger,
/// compares them with it and voids what the decision path left in doubt, reaching the
/// decision path and the pipeline through what it is handed.
pub(crate) struct Recovery {
    decider: Arc<Decider>,
    pipeline: Arc<Pipeline>,
    followups: Arc<Followups>,
    counters: Arc<dyn CounterStore>,
    cache: Arc<PolicyCache>,
    clock: Arc<dyn Clock>,
    prefix: String,
    ledger: Arc<dyn LedgerStore>,
    /// A fresh in-process store to replay the ledger into.
    scratch: ScratchStore,
    /// One rebuild of shards at a time in this instance.
    reopening: tokio::sync::Mutex<()>,
    /// Whether this instance sweeps after dead ones, and its lease.
    janitor: Arc<Janitor>,
    /// What the last verify found.
    drift: verify::DriftWatch,
    /// The failpoints tests arm (shared with the drain).
    faults: Arc<crate::engine::faults::Faults>,
}

/// What recovery works with, wired by the engine's composition.
pub(crate) struct RecoveryPorts {
    pub(crate) decider: Arc<Decider>,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) followups: Arc<Followups>,
    pub(crate) counters: Arc<dyn CounterStore>,
    pub(crate) cache: Arc<PolicyCache>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) prefix: String,
    pub(crate) ledger: Arc<dyn LedgerStore>,
    pub(crate) scratch: ScratchStore,
    pub(crate) janitor: Arc<Janitor>,
    pub(crate) faults: Arc<crate::engine::faults::Faults>,
}

impl Recovery {
    /// Recovery over `ports`.
    pub(crate) fn new(ports: RecoveryPorts) -> Self {
        let RecoveryPorts {
            decider,
            pipeline,
            followups,
            counters,
            cache,
            clock,
            prefix,
            ledger,
            scratch,
            janitor,
            faults,
        } = ports;
        Self {
            decider,
            pipeline,
            followups,
            counters,
            cache,
            clock,
            prefix,
            ledger,
            scratch,
            reopening: tokio::sync::Mutex::new(()),
            janitor,
            drift: verify::DriftWatch::default(),
            faults,
        }
    }

    /// The current time on the clock, to the millisecond (see `Engine::now`).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(self.clock.now(), 3)
    }

    /// The counter store.
    pub(crate) fn counters(&self) -> &dyn CounterStore {
        self.counters.as_ref()
    }

    /// Whether this instance sweeps after dead ones, and its lease.
    pub(crate) fn janitor(&self) -> &Janitor {
        &self.janitor
    }

    /// Whether a store `error` is answered as a degraded allow.
    pub(crate) fn fails_open(&self, error: &StoreError) -> bool {
        self.decider.fails_open(error)
    }
}

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
