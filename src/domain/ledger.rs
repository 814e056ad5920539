//! The ledger's record: what one entry says happened to which policies.
//!
//! These are domain data, written by the engine and kept by the ledger adapters; the
//! persisted formats (stream entries, SQL rows) are produced by their codecs from these.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// An allowed consume charged its policies.
    Charge,
    /// Part or all of a charge was given back.
    Refund,
    /// A hold reserved quota (charged like a consume).
    Hold,
    /// A hold was settled; the unsettled rest was given back.
    Commit,
    /// A hold was given back on request.
    Release,
    /// A hold was given back because it expired unsettled.
    Expire,
    /// A consume was denied (recorded only for policies with `ledger_denials`).
    Deny,
}

impl EntryKind {
    /// Every kind, in wire spelling order.
    pub const ALL: [EntryKind; 7] = [
        Self::Charge,
        Self::Refund,
        Self::Hold,
        Self::Commit,
        Self::Release,
        Self::Expire,
        Self::Deny,
    ];

    /// The wire and column spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
            Self::Hold => "hold",
            Self::Commit => "commit",
            Self::Release => "release",
            Self::Expire => "expire",
            Self::Deny => "deny",
        }
    }

    /// Parses the spelling of [`EntryKind::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// One policy's part of an entry: the units it was charged (or given back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAmount {
    /// The policy.
    pub policy_id: String,
    /// Units charged (charge, hold) or given back (refund, commit, release, expire); for a
    /// deny, the units that were asked for.
    pub amount: u64,
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Unique per entry (a UUIDv7 string); the idempotency key of the drain.
    pub id: String,
    /// When the decision was made (the service clock).
    pub at: DateTime<Utc>,
    /// What happened.
    pub kind: EntryKind,
    /// The action.
    pub action: String,
    /// The subject.
    pub subject: String,
    /// The request's amount: charged, refunded, held, settled or released.
    pub amount: u64,
    /// The consume this entry belongs to (charges, refunds, denials).
    pub consumption_id: Option<String>,
    /// The hold this entry belongs to (holds and their settlement).
    pub hold_id: Option<String>,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Per policy amounts.
    pub policies: Vec<PolicyAmount>,
    /// Internal: how to give a charge or hold back (its counter keys and buckets), as JSON.
    /// Not part of the public API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
