//! What the decision path hands over when a store call failed: a port, so that the
//! decision path names no part of recovery, which implements it
//! (`recovery::Followups`) and does the work in the background.

use crate::domain::LedgerEntry;

/// Where the decision path reports what recovery must follow up.
pub(crate) trait Followup: Send + Sync {
    /// An attempt answered 503 after its store call failed in a way that may have let
    /// Redis run it (timed out, or the connection broke): `entry`, appended to `stream` if
    /// it ran, kept under `idempotency`; `intent`: the key of its intent, when it was
    /// decided across Redis Cluster slots. It is voided once that is settled.
    fn doubt(
        &self,
        entry: &LedgerEntry,
        stream: &str,
        idempotency: Option<String>,
        intent: Option<String>,
    );

    /// A decision found a shard without its epoch: the background watch rebuilds it.
    fn want_rebuild(&self);
}
