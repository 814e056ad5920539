//! The ledger port: where the engine keeps entries for good and reads them back.
//!
//! The SQL adapters (`crate::ledger::sql`, Postgres and SQLite) implement [`LedgerStore`];
//! the group-commit writer and the drain write through it.

use crate::domain::{ActionSet, ConsumptionId, EntryKind, HoldId, LedgerEntry};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

/// The most entries one page may hold.
pub(crate) const MAX_PAGE: u32 = 1_000;

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
    /// Only these actions (an API key's): every action by default.
    pub actions: ActionSet,
}

/// A page of entries, newest first, and the cursor of the next (older) page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPage {
    /// At most the page size asked for, newest first.
    pub items: Vec<LedgerEntry>,
    /// Pass back to get the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// One action's ledger activity in one UTC hour: what the "today" view charts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourActivity {
    /// The action.
    pub action: String,
    /// The hour's start.
    pub hour: DateTime<Utc>,
    /// Allowed consumes and holds (`charge` and `hold` entries).
    pub charges: u64,
    /// Their units, together.
    pub amount: u64,
    /// Recorded denials (`deny` entries: policies with `ledger_denials`).
    pub denials: u64,
}

/// A subject's recorded denials for one action over a span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedSubject {
    /// The action.
    pub action: String,
    /// The subject.
    pub subject: String,
    /// How many `deny` entries it has.
    pub denials: u64,
}

/// Why the ledger could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// The database is unreachable or failed; worth retrying (503).
    #[error("ledger store unavailable")]
    Unavailable(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
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
    async fn charge_of(
        &self,
        consumption_id: ConsumptionId,
    ) -> Result<Option<LedgerEntry>, LedgerError>;
    /// The `hold` entry of a hold.
    async fn hold_of(&self, hold_id: HoldId) -> Result<Option<LedgerEntry>, LedgerError>;
    /// The sum of the `refund` entries of a consumption.
    async fn refunded(&self, consumption_id: ConsumptionId) -> Result<u64, LedgerError>;
    /// The sum of the `refund` entries of a consumption inserted before the one numbered
    /// `seq`.
    async fn refunded_before(
        &self,
        consumption_id: ConsumptionId,
        seq: i64,
    ) -> Result<u64, LedgerError>;
    /// Whether a folded row (`engine::pipeline::fold`) stands for the charge whose entry
    /// is `id`, made at `at`: its row is one of the minute `at` is in.
    async fn folded_in(
        &self,
        id: crate::domain::EntryId,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError>;
    /// The `seq` (insertion number) of the first entry inserted of those made at or after
    /// `at`; `None` if there is none.
    async fn first_seq_since(&self, at: DateTime<Utc>) -> Result<Option<i64>, LedgerError>;
    /// Up to `limit` entries inserted after the one numbered `after` (of `action` only, when
    /// given), in insertion order, each with its `seq`.
    async fn entries_after(
        &self,
        after: i64,
        limit: u32,
        action: Option<&crate::domain::Action>,
    ) -> Result<Vec<(i64, LedgerEntry)>, LedgerError>;
    /// Per action (only `action`'s when given) and UTC hour with any entry: charges,
    /// their units and denials in `[from, to)`, found through the `at` index. Hours and
    /// actions without entries are left out.
    async fn activity(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
    ) -> Result<Vec<HourActivity>, LedgerError>;
    /// The `limit` subjects with the most recorded denials in `[from, to)` (of `action`
    /// when given), most first.
    async fn top_denied(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeniedSubject>, LedgerError>;
    /// Adds alert events told outside an entry's transaction (a give-back's share in other
    /// slots of a Redis Cluster); those already there are left as they are.
    async fn add_events(
        &self,
        events: &[crate::engine::alerts::AlertEvent],
    ) -> Result<(), LedgerError>;
    /// The `seq` up to which every entry is settled (committed, or never to be), for the
    /// readers that follow the ledger by `seq`: appends may run several at once, and one
    /// commit higher numbers before another commits lower ones. `None` for an empty ledger.
    async fn settled_seq(&self) -> Result<Option<i64>, LedgerError>;
    /// The `seq` of each of `ids` the ledger holds.
    async fn seqs_of(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, i64>, LedgerError>;
    /// Whether appends may run two at a time to advantage: the drain then moves the
    /// streams in two lanes, each inserting while the other reads. (Postgres: each append
    /// is one statement, on a core of its own; SQLite has one writer at a time.)
    fn appends_in_parallel(&self) -> bool {
        false
    }
    /// Raises the floors of the Redis shards' write generations (under `prefix`) to
    /// `generations`, each read after the drain moved a batch of its shard's stream into
    /// SQL (`counters::redis::generations`); a floor never goes down.
    async fn record_generations(
        &self,
        prefix: &str,
        generations: &[(u16, u64)],
    ) -> Result<(), LedgerError>;
    /// The floors of the Redis shards' write generations under `prefix`.
    async fn generations(&self, prefix: &str) -> Result<Vec<(u16, u64)>, LedgerError>;
    /// Deletes at most `batch` entries older than `cutoff`; returns how many went.
    async fn delete_older_than(
        &self,
        cutoff: DateTime<Utc>,
        batch: u32,
    ) -> Result<u64, LedgerError>;
}

impl LedgerError {
    /// The database is unavailable because of `cause`.
    pub(crate) fn unavailable(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Unavailable(std::sync::Arc::new(cause))
    }
}
