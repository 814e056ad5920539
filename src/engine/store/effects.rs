//! What a consume does in the same atomic step as its charges, besides counting (an
//! idempotency record, ledger entries, a hold, a cross-slot intent or reservation), and
//! what the store answers.

use super::Evaluation;

/// Work a consume does in the same atomic step as its charges, besides counting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Remember a charged answer under an idempotency key, and replay it on a retry.
    pub(crate) idempotency: Option<IdempotencyRecord>,
    /// Append a ledger entry to the shard's stream (Redis; the in-process store leaves the
    /// ledger to the engine, which writes it to SQL before answering).
    pub(crate) ledger: Option<LedgerAppend>,
    /// Open a hold: keep its record and index it by expiry.
    pub(crate) hold: Option<HoldOpen>,
    /// Redis Cluster, a consume across slots, at home: open its intent when the home
    /// charges are applied (the idempotency record is then only checked, and the ledger
    /// entry and hold wait for [`CounterStore::finalize`]).
    pub(crate) intent: Option<IntentOpen>,
    /// Redis Cluster, a consume across slots, in another slot: refuse when the attempt was
    /// undone there already or its deadline passed; else record the reservation.
    pub(crate) reservation: Option<ReservationOpen>,
}

/// The intent of a consume across Redis Cluster slots, kept at home (see `engine::crossslot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentOpen {
    /// `keys::intent`.
    pub(crate) key: String,
    /// `keys::intents_index`.
    pub(crate) index_key: String,
    /// The attempt's id: the index's member.
    pub(crate) member: String,
    /// After it (Unix ms), the attempt can no longer commit.
    pub(crate) deadline_ms: i64,
    /// What undoing it takes (`codec::encode_intent`).
    pub(crate) record: String,
}

/// A reservation of a consume across Redis Cluster slots, in one foreign slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationOpen {
    /// `keys::reservation`.
    pub(crate) key: String,
    /// After it (Unix ms, by the caller's clock), the reservation is refused.
    pub(crate) deadline_ms: i64,
    /// The caller's clock when it sends the call (not the decision's instant): a stalled
    /// caller cannot reserve after the deadline.
    pub(crate) call_now_ms: i64,
}

/// The commit point of a consume across Redis Cluster slots, at home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalize {
    /// The intent's key, its index and the attempt's id.
    pub(crate) intent: IntentOpen,
    /// The evaluation's reply numbers, as the consume script formats them (kept with the
    /// idempotency record, and appended to a keyed ledger entry).
    pub(crate) numbers: String,
    /// The idempotency record to keep, the ledger entry and the hold to open.
    pub(crate) effects: Effects,
}

/// The answer to a [`Finalize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalized {
    /// Committed: the ledger entry is appended.
    Committed,
    /// The idempotency key was used by a concurrent retry that committed first.
    Replayed(String),
    /// Not open any more (abandoned, or past its deadline): nothing done.
    Aborted,
}

/// An idempotency record to keep when the decision charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdempotencyRecord {
    /// Where it is kept (`keys::SubjectKeys::idempotency`).
    pub(crate) key: String,
    /// How long it is kept.
    pub(crate) ttl_ms: i64,
    /// What to keep (opaque to the store); replayed with the evaluation that was applied.
    pub(crate) record: String,
    /// Kept as in flight until [`Undoable::confirm`](super::Undoable::confirm) (the
    /// in-process store, whose entry commits after the decision): a retry meanwhile is
    /// told to wait ([`Decided::InFlight`]), never replayed an answer that may yet be
    /// undone.
    pub(crate) pending: bool,
}

/// Ledger entries to append, serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LedgerAppend {
    /// The shard's stream.
    pub(crate) stream: String,
    /// The entry to append when the decision is allowed (and committed).
    pub(crate) allowed: String,
    /// The entry to append when it is denied, if denials are recorded.
    pub(crate) denied: Option<String>,
    /// Whether `allowed` ends with a kept answer without an idempotency record (a policy
    /// alerts: the answer tells which thresholds the decision crossed): the store appends
    /// the reply numbers to it, as it does for a keyed consume's.
    pub(crate) keeps_answer: bool,
    /// With `keeps_answer`, when only a decision that crosses a threshold needs its
    /// answer kept: the store then appends `allowed` cut to the plain entry unless usage
    /// crosses one of the levels.
    pub(crate) on_crossing: Option<OnCrossing>,
    /// A consume recorded in the ledger's totals: where its entry waits instead of the
    /// stream (an entry that keeps an answer crossed goes to the stream all the same).
    pub(crate) totals: Option<TotalsAppend>,
}

/// Where a consume recorded in the ledger's totals waits to be moved into SQL: its
/// shard's hash (`keys::totals_waiting`), under the allowed entry's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TotalsAppend {
    /// The shard's hash of waiting consumes.
    pub(crate) key: String,
    /// The allowed entry's id, hyphenated.
    pub(crate) id: String,
}

/// When an alerting entry keeps its answer: only if the decision takes a budget across a
/// threshold (`decision::plan::Plan::alert_levels`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OnCrossing {
    /// The length of the entry without its kept answer: `allowed` starts with it.
    pub(crate) plain_len: usize,
    /// `(charge index, usage at which a threshold is reached)` for every threshold of
    /// every alerting charge: a decision crosses one when usage goes from below it
    /// (usage after less the charge's cost) to at or above it.
    pub(crate) levels: Vec<(usize, u64)>,
}

/// A hold to open when the decision charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldOpen {
    /// The hold's record key.
    pub(crate) record_key: String,
    /// The shard's index of open holds (scored by expiry).
    pub(crate) index_key: String,
    /// The hold id (the index member).
    pub(crate) hold_id: String,
    /// When it expires, Unix ms.
    pub(crate) expires_at_ms: i64,
    /// What to keep (opaque to the store): how to give the hold back.
    pub(crate) record: String,
    /// How long the record is kept (beyond expiry, so late commits get a clear 409).
    pub(crate) ttl_ms: i64,
}

/// The store's answer to a consume with [`Effects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Decided now.
    Fresh(Evaluation),
    /// The idempotency key was used before: the kept record and the evaluation then applied.
    Replayed {
        /// The record kept with the key.
        record: String,
        /// The evaluation of the original decision.
        evaluation: Evaluation,
    },
    /// A reservation refused: its attempt was undone in that slot already, or its deadline
    /// passed. Nothing was decided.
    Refused,
    /// The idempotency key's first request is still being decided (its entry commits):
    /// nothing was decided; retry shortly.
    InFlight,
}
