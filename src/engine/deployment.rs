//! How this instance makes its counters durable, chosen once in `startup`: the one place
//! that knows the two deployments apart. The decision path never asks which it runs in;
//! it calls the ledger pipeline (`engine::unit`), which does what the deployment needs.

use super::pipeline::backlog::Backlog;
use super::pipeline::drain::Drainer;
use super::recovery::snapshot::{SnapshotStore, Snapshots};
use super::shards::ShardStates;
use super::store::Undoable;
use std::sync::Arc;

/// The deployment: in process (the embedded default), or on Redis.
pub(crate) enum Deployment {
    /// The in-process store: each change commits its entries through the group-commit
    /// writer before the answer (and is undone if they cannot be); snapshots bound what a
    /// start replays.
    Embedded(Embedded),
    /// Redis: each script appends its change's entries to a ledger stream in the same
    /// atomic step; the drain moves them into SQL.
    Streamed(Streamed),
}

/// What the embedded deployment has beside its counter store.
pub(crate) struct Embedded {
    /// The in-process store and its snapshot table.
    pub(crate) snapshots: Snapshots,
    /// The same store, undoing a change whose entry could not be committed
    /// (`pipeline::unit`).
    pub(crate) undo: Arc<dyn Undoable>,
}

/// What a Redis deployment runs beside its counter store.
pub(crate) struct Streamed {
    /// Moves streamed entries into SQL; refunds ask it to run at once when their charge
    /// is not in SQL yet.
    pub(crate) drain: Arc<Drainer>,
    /// The bound on what waits in the streams.
    pub(crate) backlog: Backlog,
    /// The shards' epochs and locks, for rebuilding them from the ledger.
    pub(crate) shards: Arc<dyn ShardStates>,
    /// Where checkpoints of the ledger's replay are kept (`recovery::checkpoint`).
    pub(crate) checkpoints: Arc<dyn SnapshotStore>,
}

impl Deployment {
    /// The Redis side of the deployment (`None` in process).
    pub(crate) fn streamed(&self) -> Option<&Streamed> {
        match self {
            Self::Streamed(streamed) => Some(streamed),
            Self::Embedded(_) => None,
        }
    }

    /// The drain (Redis only).
    pub(crate) fn drain(&self) -> Option<&Arc<Drainer>> {
        self.streamed().map(|s| &s.drain)
    }

    /// The backlog bound (Redis only).
    pub(crate) fn backlog(&self) -> Option<&Backlog> {
        self.streamed().map(|s| &s.backlog)
    }

    /// The shards' states (Redis only).
    pub(crate) fn shards(&self) -> Option<&Arc<dyn ShardStates>> {
        self.streamed().map(|s| &s.shards)
    }

    /// The table of the ledger replay's checkpoints (Redis only).
    pub(crate) fn checkpoints(&self) -> Option<&Arc<dyn SnapshotStore>> {
        self.streamed().map(|s| &s.checkpoints)
    }

    /// The in-process store and its snapshot table (embedded only).
    pub(crate) fn snapshots(&self) -> Option<&Snapshots> {
        match self {
            Self::Embedded(embedded) => Some(&embedded.snapshots),
            Self::Streamed(_) => None,
        }
    }

    /// Whether the ledger streams with each change (Redis): the writer then only takes
    /// degraded allows, and an attempt answered 503 may have been applied.
    pub(crate) fn streams_ledger(&self) -> bool {
        self.streamed().is_some()
    }
}
