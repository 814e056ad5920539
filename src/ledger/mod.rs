//! The durable ledger: every charge, refund, hold, settlement and expiry, and the denials
//! of policies that ask for them.
//!
//! With Redis, the consume script appends each entry to a Redis Stream in the same atomic
//! step as the charge; [`drain`] moves them into the SQL ledger in batches (insert, commit,
//! then acknowledge), so a crash at any point loses nothing and duplicates nothing (entry
//! ids are unique; inserts ignore conflicts). With the embedded counters, entries are
//! written to SQL directly by the [`writer::LedgerWriter`] (group commit) before the answer.

mod cursor;
pub mod drain;
pub mod retention;
pub mod sql;
pub mod writer;

use async_trait::async_trait;
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

/// The most entries one page may hold.
pub const MAX_PAGE: u32 = 1_000;

/// Which entries a page holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerFilter {
    /// Only this subject.
    pub subject: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only this kind.
    pub kind: Option<EntryKind>,
    /// Only entries at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// Only entries before this instant.
    pub to: Option<DateTime<Utc>>,
}

/// A page of entries, newest first, and the cursor of the next (older) page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPage {
    /// The entries.
    pub items: Vec<LedgerEntry>,
    /// Pass back to get the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Why the ledger could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database is unreachable or failed; worth retrying (503).
    #[error("ledger store unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A cursor the client sent is not one we made (400/422).
    #[error("invalid cursor")]
    BadCursor,
    /// A stored row no longer parses, or an entry to store breaks a constraint of the
    /// table (e.g. an amount above 2^53 - 1): a bug, retrying cannot help (500).
    #[error("invalid ledger row: {0}")]
    Corrupt(String),
}

/// Where entries are kept for good: Postgres or SQLite.
#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Inserts entries in one transaction, ignoring ids already present; returns how many
    /// were new.
    async fn append(&self, entries: &[LedgerEntry]) -> Result<u64, LedgerError>;
    /// A page of entries matching `filter`, newest first (in insertion order), `limit`
    /// at most 1,000, after `cursor` (from an earlier page).
    async fn page(
        &self,
        filter: &LedgerFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<LedgerPage, LedgerError>;
    /// The `charge` entry of a consumption.
    async fn charge_of(&self, consumption_id: &str) -> Result<Option<LedgerEntry>, LedgerError>;
    /// The `hold` entry of a hold.
    async fn hold_of(&self, hold_id: &str) -> Result<Option<LedgerEntry>, LedgerError>;
    /// The sum of the `refund` entries of a consumption.
    async fn refunded(&self, consumption_id: &str) -> Result<u64, LedgerError>;
    /// Deletes at most `batch` entries older than `cutoff`; returns how many went.
    async fn delete_older_than(
        &self,
        cutoff: DateTime<Utc>,
        batch: u32,
    ) -> Result<u64, LedgerError>;
}
