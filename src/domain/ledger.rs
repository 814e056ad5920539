//! The ledger's record: what one entry says happened to which policies.
//!
//! These are domain data, written by the engine and kept by the ledger adapters. They
//! know no format: stream entries and SQL columns are written and read by
//! `engine::codec`, the one codec of every persisted record.

use super::{Action, Attributes, Budget, PolicyId, Scope, Subject};
use chrono::{DateTime, Utc};
use std::fmt;

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// A charge or hold was given back whole because its request was answered 503 while
    /// Redis may still have decided it (and did): the request never took effect.
    Void,
}

impl EntryKind {
    /// Every kind, in wire spelling order.
    pub(crate) const ALL: [EntryKind; 8] = [
        Self::Charge,
        Self::Refund,
        Self::Hold,
        Self::Commit,
        Self::Release,
        Self::Expire,
        Self::Deny,
        Self::Void,
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
            Self::Void => "void",
        }
    }

    /// Parses the spelling of [`EntryKind::as_str`].
    pub(crate) fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// One policy's part of an entry: the units it was charged (or given back).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicyAmount {
    /// The policy (it may have been deleted since: entries outlive policies).
    pub policy_id: PolicyId,
    /// Units charged (charge, hold) or given back (refund, commit, release, expire); for a
    /// deny, the units that were asked for.
    pub amount: u64,
    /// The policy's scope when the entry was made: with the entry's subject and attributes,
    /// it names the budget the units went to ([`LedgerEntry::budget`]).
    pub scope: Scope,
}

/// How one counter gets units back, as it was when the charge was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Restore {
    /// A calendar counter (its key names the period).
    Calendar {
        /// When the period ends, Unix ms (the counter is kept until then); 0 in entries
        /// written before this was recorded.
        period_end_ms: i64,
    },
    /// A rolling counter's bucket, if it still counts.
    Rolling {
        /// The bucket the units went to.
        bucket: i64,
        /// Bucket length, ms.
        bucket_ms: i64,
        /// W / B.
        buckets: i64,
    },
    /// A calendar period in the request's own zone (`timezone_attribute`): units go back
    /// only to the period they were charged in.
    ZonedCalendar {
        /// The end of the period in the charging request's zone (what the charge offered
        /// the store), Unix ms.
        period_end_ms: i64,
        /// When the units were charged, Unix ms.
        charged_at_ms: i64,
    },
    /// A token bucket.
    TokenBucket {
        /// Refill period, ms.
        period_ms: i64,
        /// The policy's limit when charged (the drain rate).
        limit: u64,
    },
    /// A lifetime counter (it never resets).
    Lifetime,
}

/// One counter a charge or hold went to, with what it takes to give the units back later
/// (refunds, and the settlement, release or expiry of holds).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterCharge {
    /// The policy the counter belongs to.
    pub policy_id: PolicyId,
    /// The counter's key in the counter store.
    pub key: String,
    /// How to give units back to it.
    pub restore: Restore,
    /// Amount policies get amounts back; count policies get their 1 back only when the
    /// whole charge is.
    pub by_amount: bool,
    /// What the charge put on the counter.
    pub charged: u64,
    /// The policy's scope: the budget the counter belongs to (see [`PolicyAmount::scope`]).
    pub scope: Scope,
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Unique per entry; the key that makes the drain's and the writer's inserts idempotent.
    pub id: EntryId,
    /// When the decision was made (the service clock).
    pub at: DateTime<Utc>,
    /// What happened.
    pub kind: EntryKind,
    /// The action the charge was for.
    pub action: Action,
    /// Who was charged: with the action, it names the counters the entry touched.
    pub subject: Subject,
    /// The request's amount: charged, refunded, held, settled or released.
    pub amount: u64,
    /// The consume this entry belongs to (charges, refunds, denials).
    pub consumption_id: Option<ConsumptionId>,
    /// The hold this entry belongs to (holds and their settlement).
    pub hold_id: Option<HoldId>,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Per policy amounts.
    pub policies: Vec<PolicyAmount>,
    /// The request's attributes (give-backs copy those of their charge or hold).
    pub attributes: Attributes,
    /// Charges and holds: the counters charged, so that they can be given back. Empty for
    /// every other kind. Internal: not part of the public API.
    pub counters: Vec<CounterCharge>,
    /// Holds: when the hold is released unless settled. Internal.
    pub hold_expires_at: Option<DateTime<Utc>>,
    /// A charge or hold with an idempotency key, on the embedded default: the answer kept
    /// for retries, exactly as the counter store keeps it, so that a restart can keep it
    /// again. Internal.
    pub kept_answer: Option<KeptAnswer>,
    /// What the entry adds to the ledger's totals (`ledger_totals`), per policy, budget
    /// and counter period: only a consume recorded in the totals (its policies record
    /// `totals`) or what voids one. Empty for every other entry.
    pub totals: Vec<TotalLine>,
    /// A row that folds consumes recorded in the totals (`engine::pipeline::fold`): the
    /// ids of their entries (requests allowed for a `charge`, denied for a `deny`). Its
    /// counters and totals are theirs, summed; it names no subject of theirs. Empty for
    /// every other entry, which stands for itself.
    pub folded: Vec<EntryId>,
}

/// What one entry adds to one row of the ledger's totals: a policy's budget in one counter
/// period (the calendar period, the rolling window's bucket, or the hour for a lifetime or
/// per-request window). A void adds the negative of what it voids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TotalLine {
    /// The policy.
    pub policy_id: PolicyId,
    /// The budget, as [`Budget::text`] names it.
    pub budget: String,
    /// When the counter period ends.
    pub period_end: DateTime<Utc>,
    /// The units allowed.
    pub amount: i64,
    /// The requests allowed.
    pub allowed: i64,
    /// The requests denied.
    pub denied: i64,
}

impl TotalLine {
    /// What a void of the entry holding this line adds: its negative.
    pub fn voided(&self) -> Self {
        Self {
            amount: -self.amount,
            allowed: -self.allowed,
            denied: -self.denied,
            ..self.clone()
        }
    }
}

impl LedgerEntry {
    /// The budget of `scope` this entry's request fell in: the values of the scope's keys
    /// (an entry always carries those its scopes name).
    pub fn budget(&self, scope: &Scope) -> Budget {
        scope.budget_of(&self.subject, &self.attributes)
    }
}

/// The answer a counter store keeps under an idempotency key, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptAnswer {
    /// The store's record: the engine's record, then the evaluation's numbers.
    pub text: String,
    /// When the store lets it go, Unix ms.
    pub expires_at_ms: i64,
}

/// Why an identifier's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' is not a valid {what}")]
pub struct BadId {
    what: &'static str,
    text: String,
}

impl BadId {
    fn new(what: &'static str, text: &str) -> Self {
        let text = text.chars().take(80).collect();
        Self { what, text }
    }
}

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(uuid::Uuid);

        impl $name {
            /// A new id: a UUIDv7, so ids sort roughly by creation time.
            pub(crate) fn new() -> Self {
                Self(uuid::Uuid::now_v7())
            }

            /// Parses the hyphenated form [`fmt::Display`] writes.
            pub fn parse(text: &str) -> Result<Self, BadId> {
                uuid::Uuid::try_parse(text)
                    .map(Self)
                    .map_err(|_| BadId::new($what, text))
            }

            /// The id's 128 bits, for compact encodings.
            pub(crate) fn to_bits(self) -> u128 {
                self.0.as_u128()
            }

            /// The id of these 128 bits (what [`Self::to_bits`] gave).
            pub(crate) fn from_bits(bits: u128) -> Self {
                Self(uuid::Uuid::from_u128(bits))
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }
    };
}

uuid_id!(
    /// A ledger entry's id.
    EntryId,
    "ledger entry id"
);
uuid_id!(
    /// A consume's id: what refunds name.
    ConsumptionId,
    "consumption id"
);

/// A hold's id, `<uuid>.<shard>`: it names the hold and the counter-store shard where its
/// record lives, so settling a hold needs no lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HoldId {
    uuid: uuid::Uuid,
    shard: u16,
}

impl HoldId {
    /// A new hold id whose record lives in `shard`.
    pub(crate) fn new(shard: u16) -> Self {
        Self {
            uuid: uuid::Uuid::now_v7(),
            shard,
        }
    }

    /// The shard the hold's record lives in.
    pub fn shard(&self) -> u16 {
        self.shard
    }

    /// The uuid's 128 bits, for compact encodings.
    pub(crate) fn uuid_bits(&self) -> u128 {
        self.uuid.as_u128()
    }

    /// The hold id of these uuid bits and shard (what [`Self::uuid_bits`] and
    /// [`Self::shard`] gave).
    pub(crate) fn from_parts(uuid_bits: u128, shard: u16) -> Self {
        Self {
            uuid: uuid::Uuid::from_u128(uuid_bits),
            shard,
        }
    }

    /// Parses `<uuid>.<shard>` as [`fmt::Display`] writes it.
    pub fn parse(text: &str) -> Result<Self, BadId> {
        let bad = || BadId::new("hold id", text);
        let (uuid, shard) = text.rsplit_once('.').ok_or_else(bad)?;
        let uuid = uuid::Uuid::try_parse(uuid).map_err(|_| bad())?;
        let shard = shard
            .parse()
            .ok()
            .filter(|_| shard.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(bad)?;
        Ok(Self { uuid, shard })
    }
}

impl fmt::Display for HoldId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.uuid.hyphenated(), self.shard)
    }
}

/// A caller's idempotency key: 1-128 printable characters, scoped to action + subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key, in characters.
    pub(crate) const MAX_CHARS: usize = 128;

    /// Parses a key: 1-128 characters, none of them control characters.
    pub fn parse(text: &str) -> Result<Self, BadId> {
        let chars = text.chars().count();
        if chars == 0 || chars > Self::MAX_CHARS || text.chars().any(char::is_control) {
            return Err(BadId::new("idempotency key", text));
        }
        Ok(Self(text.to_owned()))
    }

    /// The key as text.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_what_they_write() {
        let entry = EntryId::new();
        assert_eq!(EntryId::parse(&entry.to_string()), Ok(entry));
        let consumption = ConsumptionId::new();
        assert_eq!(
            ConsumptionId::parse(&consumption.to_string()),
            Ok(consumption)
        );
        let hold = HoldId::new(63);
        assert_eq!(HoldId::parse(&hold.to_string()), Ok(hold));
        assert_eq!(hold.shard(), 63);
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in ["", "x", "0193a3c4-0000-7000-8000-00000000000"] {
            assert!(ConsumptionId::parse(bad).is_err(), "{bad}");
        }
        let uuid = "0193a3c4-0000-7000-8000-000000000000";
        assert!(HoldId::parse(uuid).is_err(), "no shard");
        for bad in ["", ".1", "x.1", "+1", "-1", "70000"] {
            let text = if bad.starts_with('.') || bad.starts_with('x') {
                bad.to_owned()
            } else {
                format!("{uuid}.{bad}")
            };
            assert!(HoldId::parse(&text).is_err(), "{text}");
        }
    }

    #[test]
    fn idempotency_keys_are_1_to_128_printable_characters() {
        assert!(IdempotencyKey::parse("order-1").is_ok());
        assert!(IdempotencyKey::parse(&"é".repeat(128)).is_ok());
        for bad in [String::new(), "é".repeat(129), "a\nb".to_owned()] {
            assert!(IdempotencyKey::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
