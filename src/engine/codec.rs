//! The one codec of every record the engine persists, besides the counters themselves.
//!
//! | record | kept in | format |
//! |---|---|---|
//! | a consume's idempotency record | the counter store (`keys::SubjectKeys::idempotency`) | [`ConsumeRecord`] as JSON, then `\n` and the evaluation's numbers ([`encode_replay`]) |
//! | a hold's record | the counter store (`keys::hold_record`) | its state (`open`, `committed`, …), `\n`, then [`HoldRecord`] as JSON |
//! | a refund's idempotency record | the counter store | the refund's [`LedgerEntry`] in its compact form ([`encode_entry`]) |
//! | a ledger entry | the shard's Redis stream (field `e`) | [`LedgerEntry`] in its compact form ([`encode_entry`], module `entry`) |
//! | an entry's policies | the SQL ledger's `policies` column | the compact form's field ([`encode_policies`], module `entry`; JSON before) |
//! | an entry's internal detail (counters, a hold's expiry, a kept answer) | the SQL ledger's `detail` column | the compact form's fields ([`encode_detail`], module `entry`; JSON before) |
//!
//! The Lua scripts (`crate::counters`) and the memory store write the envelopes (the state
//! line, the evaluation's numbers) the same way; a change here is a change there. Readers
//! accept what earlier versions wrote: stream entries and refund records used to be JSON
//! (with the counters, earlier still, as a JSON string inside it: `"detail": "[…]"`).

use super::store::{Decided, Evaluation, Outcome, StoreError};
use crate::domain::{
    Action, Attributes, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, IdempotencyKey,
    KeptAnswer, LedgerEntry, Measure, Mode, PolicyAmount, PolicyId, Restore, Scope, Subject,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod entry;
mod snapshot;
pub(crate) use snapshot::{decode_snapshot, encode_snapshot, SNAPSHOT_FORMAT};

/// A persisted record that does not read as the format it should have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what}: {why}")]
pub(crate) struct CodecError {
    what: &'static str,
    why: String,
}

impl CodecError {
    fn new(what: &'static str, why: impl std::fmt::Display) -> Self {
        Self {
            what,
            why: why.to_string(),
        }
    }
}

impl From<CodecError> for StoreError {
    fn from(error: CodecError) -> Self {
        StoreError::Protocol(error.to_string())
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_string(value).unwrap_or_default()
}

fn from_json<'a, T: Deserialize<'a>>(what: &'static str, text: &'a str) -> Result<T, CodecError> {
    serde_json::from_str(text).map_err(|e| CodecError::new(what, e))
}

/// A scope as records keep it: its key names joined by `,` (see [`Scope::names`]), absent
/// for the default scope (so records of default-scope policies read as they always did).
fn scope_wire(scope: &Scope) -> Option<String> {
    (!scope.is_default()).then(|| scope.names())
}

fn scope_from_wire(what: &'static str, wire: Option<&str>) -> Result<Scope, CodecError> {
    match wire {
        None => Ok(Scope::default()),
        Some(names) => field(what, Scope::from_names(names)),
    }
}

/// A request's attributes as records keep them: a JSON object, sorted by key.
type AttributesWire = BTreeMap<String, String>;

fn attributes_wire(attributes: &Attributes) -> AttributesWire {
    attributes
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn attributes_from_wire(
    what: &'static str,
    wire: AttributesWire,
) -> Result<Attributes, CodecError> {
    field(what, Attributes::parse("attributes", wire))
}

/// A request's attributes as the SQL ledger's `attributes` column holds them (`None`
/// when there are none).
pub(crate) fn encode_attributes(attributes: &Attributes) -> Option<String> {
    (!attributes.is_empty()).then(|| to_json(&attributes_wire(attributes)))
}

/// Reads what [`encode_attributes`] wrote.
pub(crate) fn decode_attributes(text: Option<&str>) -> Result<Attributes, CodecError> {
    const WHAT: &str = "attributes of an entry";
    match text {
        None => Ok(Attributes::default()),
        Some(text) => attributes_from_wire(WHAT, from_json(WHAT, text)?),
    }
}

fn field<T, E: std::fmt::Display>(
    what: &'static str,
    parsed: Result<T, E>,
) -> Result<T, CodecError> {
    parsed.map_err(|e| CodecError::new(what, e))
}

/// A kept idempotency record: the engine's record and the evaluation it was answered with,
/// as `consume.lua` keeps them (`record\nallowed,used,allowed,resets_at,retry_at,…`).
pub(crate) fn encode_replay(record: &str, evaluation: &Evaluation) -> String {
    format!("{record}\n{}", reply_numbers(evaluation))
}

/// The reply numbers of an evaluation, as the script formats them for an idempotency record.
pub(crate) fn reply_numbers(evaluation: &Evaluation) -> String {
    let mut numbers = vec![i64::from(evaluation.allowed)];
    for o in &evaluation.outcomes {
        numbers.extend([
            i64::try_from(o.used).unwrap_or(i64::MAX),
            i64::from(o.allowed),
            o.resets_at_ms,
            o.retry_at_ms.unwrap_or(-1),
        ]);
    }
    let text: Vec<String> = numbers.iter().map(i64::to_string).collect();
    text.join(",")
}

/// Splits a kept idempotency record into the caller's record and the original reply.
pub(crate) fn decode_replay(text: &str) -> Result<Decided, StoreError> {
    let unexpected = || StoreError::Protocol("an idempotency record is malformed".to_owned());
    let (record, numbers) = text.rsplit_once('\n').ok_or_else(unexpected)?;
    let numbers: Vec<i64> = numbers
        .split(',')
        .map(|n| n.parse().map_err(|_| unexpected()))
        .collect::<Result<_, _>>()?;
    let (&allowed, rest) = numbers.split_first().ok_or_else(unexpected)?;
    let outcomes = rest
        .chunks_exact(4)
        .map(|c| Outcome {
            used: u64::try_from(c[0]).unwrap_or(0),
            allowed: c[1] == 1,
            resets_at_ms: c[2],
            retry_at_ms: (c[3] >= 0 && c[1] == 0).then_some(c[3]),
        })
        .collect();
    Ok(Decided::Replayed {
        record: record.to_owned(),
        evaluation: Evaluation {
            allowed: allowed == 1,
            outcomes,
        },
    })
}

/// What a consume's idempotency record keeps to rebuild the original answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumeRecord {
    /// The consume's id (consumes).
    pub(crate) consumption_id: Option<ConsumptionId>,
    /// The hold and its expiry, Unix ms (holds).
    pub(crate) hold: Option<(HoldId, i64)>,
    /// The amount asked for: a retry with another amount is a conflict.
    pub(crate) amount: u64,
    /// When the original decision was made, Unix ms.
    pub(crate) at_ms: i64,
    /// The static part of each policy's answer.
    pub(crate) policies: Vec<KeptPolicy>,
    /// The request's attributes: with the subject and each policy's scope, its budgets.
    pub(crate) attributes: Attributes,
}

/// The static part of one policy's answer, kept with an idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptPolicy {
    /// The policy the answer was about (it may have been deleted since).
    pub(crate) policy_id: PolicyId,
    /// Count or amount.
    pub(crate) measure: Measure,
    /// Enforce or shadow.
    pub(crate) mode: Mode,
    /// The limit that applied.
    pub(crate) limit: u64,
    /// The window's length, seconds.
    pub(crate) window_seconds: u64,
    /// The policy's scope when it was charged.
    pub(crate) scope: Scope,
}

#[derive(Serialize, Deserialize)]
struct ConsumeWire {
    consumption_id: Option<String>,
    hold_id: Option<String>,
    hold_expires_at_ms: Option<i64>,
    amount: u64,
    at_ms: i64,
    policies: Vec<KeptPolicyWire>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: AttributesWire,
}

#[derive(Serialize, Deserialize)]
struct KeptPolicyWire {
    policy_id: String,
    amount_measure: bool,
    shadow: bool,
    limit: u64,
    window_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

/// A consume's idempotency record, before the store appends the evaluation's numbers.
pub(crate) fn encode_consume_record(record: &ConsumeRecord) -> String {
    to_json(&ConsumeWire {
        consumption_id: record.consumption_id.map(|id| id.to_string()),
        hold_id: record.hold.map(|(id, _)| id.to_string()),
        hold_expires_at_ms: record.hold.map(|(_, at)| at),
        amount: record.amount,
        at_ms: record.at_ms,
        policies: record
            .policies
            .iter()
            .map(|p| KeptPolicyWire {
                policy_id: p.policy_id.to_string(),
                amount_measure: p.measure == Measure::Amount,
                shadow: p.mode == Mode::Shadow,
                limit: p.limit,
                window_seconds: p.window_seconds,
                scope: scope_wire(&p.scope),
            })
            .collect(),
        attributes: attributes_wire(&record.attributes),
    })
}

/// Reads what [`encode_consume_record`] wrote.
pub(crate) fn decode_consume_record(text: &str) -> Result<ConsumeRecord, CodecError> {
    const WHAT: &str = "idempotency record";
    let wire: ConsumeWire = from_json(WHAT, text)?;
    let hold = match (wire.hold_id, wire.hold_expires_at_ms) {
        (Some(id), Some(at)) => Some((field(WHAT, HoldId::parse(&id))?, at)),
        _ => None,
    };
    Ok(ConsumeRecord {
        consumption_id: wire
            .consumption_id
            .map(|id| field(WHAT, ConsumptionId::parse(&id)))
            .transpose()?,
        hold,
        amount: wire.amount,
        at_ms: wire.at_ms,
        policies: wire
            .policies
            .into_iter()
            .map(|p| {
                Ok(KeptPolicy {
                    policy_id: field(WHAT, PolicyId::parse("policy_id", &p.policy_id))?,
                    measure: if p.amount_measure {
                        Measure::Amount
                    } else {
                        Measure::Count
                    },
                    mode: if p.shadow {
                        Mode::Shadow
                    } else {
                        Mode::Enforce
                    },
                    limit: p.limit,
                    window_seconds: p.window_seconds,
                    scope: scope_from_wire(WHAT, p.scope.as_deref())?,
                })
            })
            .collect::<Result<_, CodecError>>()?,
        attributes: attributes_from_wire(WHAT, wire.attributes)?,
    })
}

/// What undoing a consume across Redis Cluster slots takes: the counters it charges at
/// home and in each foreign shard (`engine::crossslot`), kept in its intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IntentRecord {
    /// The home shard's counters.
    pub(crate) home: Vec<CounterCharge>,
    /// Each foreign shard's counters, in reservation order.
    pub(crate) foreign: Vec<(u16, Vec<CounterCharge>)>,
}

#[derive(Serialize, Deserialize)]
struct IntentWire {
    home: Vec<CounterWire>,
    foreign: Vec<(u16, Vec<CounterWire>)>,
}

/// An intent's record (the part after its state, epoch and deadline lines).
pub(crate) fn encode_intent(record: &IntentRecord) -> String {
    let wires = |counters: &[CounterCharge]| counters.iter().map(CounterWire::from).collect();
    to_json(&IntentWire {
        home: wires(&record.home),
        foreign: record
            .foreign
            .iter()
            .map(|(shard, counters)| (*shard, wires(counters)))
            .collect(),
    })
}

/// An intent as the store keeps it, `<state>\n<epoch>\n<deadline>\n<record>`: its state
/// and record.
pub(crate) fn decode_intent(text: &str) -> Result<(String, IntentRecord), CodecError> {
    const WHAT: &str = "intent";
    let mut lines = text.splitn(4, '\n');
    let state = lines.next().unwrap_or_default().to_owned();
    let json = lines
        .nth(2)
        .ok_or_else(|| CodecError::new(WHAT, "fewer than four lines"))?;
    let wire: IntentWire = from_json(WHAT, json)?;
    let record = IntentRecord {
        home: decode_counter_wires(wire.home)?,
        foreign: wire
            .foreign
            .into_iter()
            .map(|(shard, counters)| Ok((shard, decode_counter_wires(counters)?)))
            .collect::<Result<_, CodecError>>()?,
    };
    Ok((state, record))
}

/// A hold's record in the counter store: everything needed to settle or expire it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldRecord {
    /// The held action.
    pub(crate) action: Action,
    /// The subject that holds.
    pub(crate) subject: Subject,
    /// The held amount.
    pub(crate) amount: u64,
    /// When it is released unless settled, Unix ms.
    pub(crate) expires_at_ms: i64,
    /// The counters it was charged to.
    pub(crate) counters: Vec<CounterCharge>,
    /// The request's attributes (its settlement's entry keeps them).
    pub(crate) attributes: Attributes,
}

impl HoldRecord {
    /// The record of the hold `entry` (a `hold` entry) opened, with its id; `None` for an
    /// entry written before holds recorded their expiry.
    pub(crate) fn opened_by(entry: &crate::domain::LedgerEntry) -> Option<(HoldId, Self)> {
        let (hold_id, expires_at) = (entry.hold_id?, entry.hold_expires_at?);
        Some((
            hold_id,
            Self {
                action: entry.action.clone(),
                subject: entry.subject.clone(),
                amount: entry.amount,
                expires_at_ms: expires_at.timestamp_millis(),
                counters: entry.counters.clone(),
                attributes: entry.attributes.clone(),
            },
        ))
    }
}

#[derive(Serialize, Deserialize)]
struct HoldWire {
    action: String,
    subject: String,
    amount: u64,
    expires_at_ms: i64,
    counters: Vec<CounterWire>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: AttributesWire,
}

/// A hold's record, without the state line the store keeps before it.
pub(crate) fn encode_hold_record(record: &HoldRecord) -> String {
    to_json(&HoldWire {
        action: record.action.to_string(),
        subject: record.subject.to_string(),
        amount: record.amount,
        expires_at_ms: record.expires_at_ms,
        counters: record.counters.iter().map(CounterWire::from).collect(),
        attributes: attributes_wire(&record.attributes),
    })
}

/// Reads a hold's record as the store keeps it: `<state>\n<record>`.
pub(crate) fn decode_hold_record(text: &str) -> Result<HoldRecord, CodecError> {
    const WHAT: &str = "hold record";
    let (_state, json) = text
        .split_once('\n')
        .ok_or_else(|| CodecError::new(WHAT, "no state line"))?;
    let wire: HoldWire = from_json(WHAT, json)?;
    Ok(HoldRecord {
        action: field(WHAT, Action::parse("action", &wire.action))?,
        subject: field(WHAT, Subject::parse("subject", &wire.subject))?,
        amount: wire.amount,
        expires_at_ms: wire.expires_at_ms,
        counters: decode_counter_wires(wire.counters)?,
        attributes: attributes_from_wire(WHAT, wire.attributes)?,
    })
}

/// One counter of a charge, flat, as every version has written it (`kind` 1 calendar,
/// 2 rolling, 3 token bucket, 4 zoned calendar; `span_ms` the bucket length or the refill
/// period; a zoned calendar's `bucket` is when it was charged).
#[derive(Serialize, Deserialize)]
struct CounterWire {
    policy_id: String,
    key: String,
    kind: u8,
    #[serde(default)]
    bucket: i64,
    #[serde(default)]
    span_ms: i64,
    #[serde(default)]
    buckets: i64,
    #[serde(default)]
    limit: u64,
    /// Calendar: when the period ends, Unix ms (absent before it was recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    end_ms: i64,
    by_amount: bool,
    charged: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl From<&CounterCharge> for CounterWire {
    fn from(c: &CounterCharge) -> Self {
        let (kind, bucket, span_ms, buckets, limit, end_ms) = match c.restore {
            Restore::Calendar { period_end_ms } => (1, 0, 0, 0, 0, period_end_ms),
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            } => (2, bucket, bucket_ms, buckets, 0, 0),
            Restore::TokenBucket { period_ms, limit } => (3, 0, period_ms, 0, limit, 0),
            Restore::ZonedCalendar {
                period_end_ms,
                charged_at_ms,
            } => (4, charged_at_ms, 0, 0, 0, period_end_ms),
        };
        Self {
            policy_id: c.policy_id.to_string(),
            key: c.key.clone(),
            kind,
            bucket,
            span_ms,
            buckets,
            limit,
            end_ms,
            by_amount: c.by_amount,
            charged: c.charged,
            scope: scope_wire(&c.scope),
        }
    }
}

fn decode_counter_wires(wires: Vec<CounterWire>) -> Result<Vec<CounterCharge>, CodecError> {
    const WHAT: &str = "counter of a charge";
    wires
        .into_iter()
        .map(|w| {
            let restore = match w.kind {
                1 => Restore::Calendar {
                    period_end_ms: w.end_ms,
                },
                2 if w.span_ms > 0 && w.buckets > 0 => Restore::Rolling {
                    bucket: w.bucket,
                    bucket_ms: w.span_ms,
                    buckets: w.buckets,
                },
                3 if w.span_ms > 0 => Restore::TokenBucket {
                    period_ms: w.span_ms,
                    limit: w.limit,
                },
                4 => Restore::ZonedCalendar {
                    period_end_ms: w.end_ms,
                    charged_at_ms: w.bucket,
                },
                kind => {
                    return Err(CodecError::new(
                        WHAT,
                        format!(
                            "kind {kind} with span {} ms and {} buckets",
                            w.span_ms, w.buckets
                        ),
                    ))
                }
            };
            Ok(CounterCharge {
                policy_id: field(WHAT, PolicyId::parse("policy_id", &w.policy_id))?,
                key: w.key,
                restore,
                by_amount: w.by_amount,
                charged: w.charged,
                scope: scope_from_wire(WHAT, w.scope.as_deref())?,
            })
        })
        .collect()
}

/// An entry's internal part: its counters, a hold's expiry and a kept answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Detail {
    /// See [`LedgerEntry::counters`].
    pub(crate) counters: Vec<CounterCharge>,
    /// See [`LedgerEntry::hold_expires_at`].
    pub(crate) hold_expires_at: Option<DateTime<Utc>>,
    /// See [`LedgerEntry::kept_answer`].
    pub(crate) kept_answer: Option<KeptAnswer>,
}

#[cfg(test)]
impl Detail {
    fn of(entry: &LedgerEntry) -> Self {
        Self {
            counters: entry.counters.clone(),
            hold_expires_at: entry.hold_expires_at,
            kept_answer: entry.kept_answer.clone(),
        }
    }
}

/// An entry's internal part as JSON: the array of its counters alone, as every version
/// wrote it, or an object once a hold's expiry or a kept answer comes with them.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum DetailWire {
    Counters(Vec<CounterWire>),
    Full(FullDetailWire),
    /// Earlier stream entries: the array as a JSON string.
    Text(String),
}

#[derive(Serialize, Deserialize)]
struct FullDetailWire {
    #[serde(default)]
    counters: Vec<CounterWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_expires_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kept: Option<KeptWire>,
}

#[derive(Serialize, Deserialize)]
struct KeptWire {
    text: String,
    expires_at_ms: i64,
}

/// As versions before the compact form wrote the `detail` column and stream entries.
#[cfg(test)]
fn detail_wire(detail: &Detail) -> Option<DetailWire> {
    let counters: Vec<CounterWire> = detail.counters.iter().map(CounterWire::from).collect();
    if detail.hold_expires_at.is_none() && detail.kept_answer.is_none() {
        return (!counters.is_empty()).then_some(DetailWire::Counters(counters));
    }
    Some(DetailWire::Full(FullDetailWire {
        counters,
        hold_expires_at_ms: detail.hold_expires_at.map(|at| at.timestamp_millis()),
        kept: detail.kept_answer.as_ref().map(|kept| KeptWire {
            text: kept.text.clone(),
            expires_at_ms: kept.expires_at_ms,
        }),
    }))
}

fn detail_from_wire(wire: Option<DetailWire>) -> Result<Detail, CodecError> {
    const WHAT: &str = "detail of an entry";
    match wire {
        None => Ok(Detail::default()),
        Some(DetailWire::Counters(wires)) => Ok(Detail {
            counters: decode_counter_wires(wires)?,
            ..Detail::default()
        }),
        Some(DetailWire::Text(text)) => decode_detail_json(&text),
        Some(DetailWire::Full(full)) => Ok(Detail {
            counters: decode_counter_wires(full.counters)?,
            hold_expires_at: full
                .hold_expires_at_ms
                .map(|ms| {
                    DateTime::<Utc>::from_timestamp_millis(ms)
                        .ok_or_else(|| CodecError::new(WHAT, format!("instant {ms} ms")))
                })
                .transpose()?,
            kept_answer: full.kept.map(|kept| KeptAnswer {
                text: kept.text,
                expires_at_ms: kept.expires_at_ms,
            }),
        }),
    }
}

/// An entry's internal part, for the SQL ledger's `detail` column (`None` when empty), in
/// compact form (see the module `entry`): the drain writes one per entry, and as JSON a
/// three-budget charge's took three times the bytes.
pub(crate) fn encode_detail(entry: &LedgerEntry) -> Option<String> {
    entry::encode_detail(entry)
}

/// Reads the `detail` column [`encode_detail`] (or an earlier version, as JSON) wrote for the
/// row whose other columns are `parts` and `policies`.
pub(crate) fn decode_detail(
    text: Option<&str>,
    parts: &EntryParts<'_>,
    policies: &[PolicyAmount],
) -> Result<Detail, CodecError> {
    match text {
        None => Ok(Detail::default()),
        Some(text) if entry::is_compact_detail(text) => entry::decode_detail(text, parts, policies),
        Some(text) => decode_detail_json(text),
    }
}

/// Reads a `detail` column as versions before the compact form wrote it (JSON).
fn decode_detail_json(text: &str) -> Result<Detail, CodecError> {
    detail_from_wire(Some(from_json("detail of an entry", text)?))
}

#[derive(Serialize, Deserialize)]
struct PolicyAmountWire {
    policy_id: String,
    amount: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

/// An entry's per-policy amounts, for the SQL ledger's `policies` column, in compact form
/// (see the module `entry`), the amounts relative to the entry's `amount`: the drain writes
/// one per entry, and as JSON a three-budget charge's took three times the bytes.
pub(crate) fn encode_policies(policies: &[PolicyAmount], amount: u64) -> String {
    entry::encode_policies(policies, amount)
}

/// An entry's policies as JSON, as versions before the compact form wrote them.
#[cfg(test)]
fn policies_wire(policies: &[PolicyAmount]) -> Vec<PolicyAmountWire> {
    policies
        .iter()
        .map(|p| PolicyAmountWire {
            policy_id: p.policy_id.to_string(),
            amount: p.amount,
            scope: scope_wire(&p.scope),
        })
        .collect()
}

/// Reads the `policies` column [`encode_policies`] (or an earlier version, as JSON) wrote
/// for the row whose amount is `amount`.
pub(crate) fn decode_policies(text: &str, amount: u64) -> Result<Vec<PolicyAmount>, CodecError> {
    match entry::decode_compact_policies(text, amount) {
        Some(policies) => policies,
        None => policies_from_wire(from_json("policies of an entry", text)?),
    }
}

fn policies_from_wire(wires: Vec<PolicyAmountWire>) -> Result<Vec<PolicyAmount>, CodecError> {
    wires
        .into_iter()
        .map(|p| {
            Ok(PolicyAmount {
                policy_id: field(
                    "policies of an entry",
                    PolicyId::parse("policy_id", &p.policy_id),
                )?,
                amount: p.amount,
                scope: scope_from_wire("policies of an entry", p.scope.as_deref())?,
            })
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
struct EntryWire {
    id: String,
    at: DateTime<Utc>,
    kind: String,
    action: String,
    subject: String,
    amount: u64,
    consumption_id: Option<String>,
    hold_id: Option<String>,
    idempotency_key: Option<String>,
    policies: Vec<PolicyAmountWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<DetailWire>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: AttributesWire,
}

/// A ledger entry as a stream entry or a refund's idempotency record: its compact form
/// (see the module `entry`).
pub fn encode_entry(entry: &LedgerEntry) -> String {
    entry::encode(entry)
}

/// Separates the entries of one stream entry that records several (the descriptors of one
/// gateway request, decided together): `FS` (0x1c), a control character that no field
/// holds and that the compact form does not use (see the module `entry`).
const ENTRY_SEPARATOR: char = '\u{1c}';

/// Several ledger entries as one stream entry holds them (see [`decode_entries`]).
pub(crate) fn encode_entries(entries: &[LedgerEntry]) -> String {
    let mut text = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            text.push(ENTRY_SEPARATOR);
        }
        text.push_str(&encode_entry(entry));
    }
    text
}

/// The ledger entries of one stream entry: one, or several written by [`encode_entries`].
pub(crate) fn decode_entries(text: &str) -> Result<Vec<LedgerEntry>, CodecError> {
    text.split(ENTRY_SEPARATOR).map(decode_entry).collect()
}

/// A keyed charge or hold as its consume appends it to a stream: the compact form, ending
/// with the answer kept until `kept_until_ms` for its retries, in compact form too, but
/// for the evaluation's numbers, which `consume.lua` appends (see the module `entry`).
pub(crate) fn encode_entry_keeping(
    entry: &LedgerEntry,
    kept_until_ms: i64,
    policies: &[KeptPolicy],
) -> String {
    entry::encode_keeping(entry, kept_until_ms, policies)
}

/// A ledger entry as JSON, as versions before the compact form wrote stream entries.
#[cfg(test)]
fn encode_entry_json(entry: &LedgerEntry) -> String {
    to_json(&EntryWire {
        id: entry.id.to_string(),
        at: entry.at,
        kind: entry.kind.as_str().to_owned(),
        action: entry.action.to_string(),
        subject: entry.subject.to_string(),
        amount: entry.amount,
        consumption_id: entry.consumption_id.map(|id| id.to_string()),
        hold_id: entry.hold_id.map(|id| id.to_string()),
        idempotency_key: entry.idempotency_key.as_ref().map(ToString::to_string),
        policies: policies_wire(&entry.policies),
        detail: detail_wire(&Detail::of(entry)),
        attributes: attributes_wire(&entry.attributes),
    })
}

/// Reads what [`encode_entry`] (or an earlier version, as JSON) wrote.
pub(crate) fn decode_entry(text: &str) -> Result<LedgerEntry, CodecError> {
    if entry::is_compact(text) {
        return entry::decode(text);
    }
    const WHAT: &str = "ledger entry";
    let wire: EntryWire = from_json(WHAT, text)?;
    let detail = detail_from_wire(wire.detail)?;
    let attributes = attributes_from_wire(WHAT, wire.attributes)?;
    entry_from_parts(
        EntryParts {
            id: &wire.id,
            at: wire.at,
            kind: &wire.kind,
            action: &wire.action,
            subject: &wire.subject,
            amount: wire.amount,
            consumption_id: wire.consumption_id.as_deref(),
            hold_id: wire.hold_id.as_deref(),
            idempotency_key: wire.idempotency_key.as_deref(),
        },
        policies_from_wire(wire.policies)?,
        attributes,
        detail,
    )
}

/// The scalar fields of an entry as text, as a stream entry or an SQL row holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryParts<'a> {
    /// The entry id, hyphenated.
    pub(crate) id: &'a str,
    /// When the decision was made.
    pub(crate) at: DateTime<Utc>,
    /// The kind's spelling ([`EntryKind::as_str`]).
    pub(crate) kind: &'a str,
    /// The action, checked as [`Action::parse`] does.
    pub(crate) action: &'a str,
    /// The subject, checked as [`Subject::parse`] does.
    pub(crate) subject: &'a str,
    /// The amount as the entry records it.
    pub(crate) amount: u64,
    /// The consumption id, if any.
    pub(crate) consumption_id: Option<&'a str>,
    /// The hold id, if any.
    pub(crate) hold_id: Option<&'a str>,
    /// The idempotency key, if any.
    pub(crate) idempotency_key: Option<&'a str>,
}

/// Builds an entry from its fields as text, checking each.
pub(crate) fn entry_from_parts(
    parts: EntryParts<'_>,
    policies: Vec<PolicyAmount>,
    attributes: Attributes,
    detail: Detail,
) -> Result<LedgerEntry, CodecError> {
    const WHAT: &str = "ledger entry";
    Ok(LedgerEntry {
        id: field(WHAT, EntryId::parse(parts.id))?,
        at: parts.at,
        kind: EntryKind::parse(parts.kind)
            .ok_or_else(|| CodecError::new(WHAT, format!("unknown kind '{}'", parts.kind)))?,
        action: field(WHAT, Action::parse("action", parts.action))?,
        subject: field(WHAT, Subject::parse("subject", parts.subject))?,
        amount: parts.amount,
        consumption_id: parts
            .consumption_id
            .map(|id| field(WHAT, ConsumptionId::parse(id)))
            .transpose()?,
        hold_id: parts
            .hold_id
            .map(|id| field(WHAT, HoldId::parse(id)))
            .transpose()?,
        idempotency_key: parts
            .idempotency_key
            .map(|key| field(WHAT, IdempotencyKey::parse(key)))
            .transpose()?,
        policies,
        attributes,
        counters: detail.counters,
        hold_expires_at: detail.hold_expires_at,
        kept_answer: detail.kept_answer,
    })
}

/// Reads a refund's idempotency record: its entry (anything after a last `\n` is the
/// store's).
pub(crate) fn decode_refund_record(text: &str) -> Result<LedgerEntry, CodecError> {
    let record = text.rsplit_once('\n').map_or(text, |(record, _)| record);
    decode_entry(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    /// A scope other than the default, so that round trips carry it.
    fn org_scope() -> Scope {
        Scope::parse("scope", &["subject", "org"]).expect("a valid scope")
    }

    fn counter(restore: Restore) -> CounterCharge {
        CounterCharge {
            policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
            key: "t{5}k".to_owned(),
            restore,
            by_amount: true,
            charged: 40,
            scope: org_scope(),
        }
    }

    #[test]
    fn several_entries_in_one_stream_entry_come_back_each_whole() {
        let first = hold_entry();
        let second = LedgerEntry {
            id: EntryId::new(),
            kind: EntryKind::Charge,
            hold_id: None,
            hold_expires_at: None,
            ..hold_entry()
        };
        let text = encode_entries(&[first.clone(), second.clone()]);
        assert_eq!(
            decode_entries(&text).expect("decodes"),
            vec![first.clone(), second]
        );
        assert_eq!(
            decode_entries(&encode_entry(&first)).expect("decodes"),
            vec![first],
            "one entry as before"
        );
    }

    fn hold_entry() -> LedgerEntry {
        LedgerEntry {
            id: EntryId::new(),
            at: Utc
                .with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
                .single()
                .expect("a valid instant"),
            kind: EntryKind::Hold,
            action: Action::parse("action", "transfer").expect("a valid action"),
            subject: Subject::parse("subject", "user \"42\" {x}|y").expect("a valid subject"),
            amount: 40,
            consumption_id: None,
            hold_id: Some(HoldId::new(9)),
            idempotency_key: Some(IdempotencyKey::parse("k-1").expect("a valid key")),
            policies: vec![PolicyAmount {
                policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
                amount: 40,
                scope: org_scope(),
            }],
            attributes: Attributes::parse(
                "attributes",
                [
                    ("org".to_owned(), "acme, inc".to_owned()),
                    ("tz".to_owned(), "Asia/Tokyo".to_owned()),
                ],
            )
            .expect("valid attributes"),
            counters: vec![
                counter(Restore::Calendar {
                    period_end_ms: 86_400_000,
                }),
                counter(Restore::Rolling {
                    bucket: 12,
                    bucket_ms: 60_000,
                    buckets: 60,
                }),
                counter(Restore::TokenBucket {
                    period_ms: 1_000,
                    limit: 5,
                }),
                counter(Restore::ZonedCalendar {
                    period_end_ms: 86_400_000,
                    charged_at_ms: 1_795_000_000_000,
                }),
            ],
            hold_expires_at: Some(
                Utc.with_ymd_and_hms(2026, 11, 21, 12, 10, 0)
                    .single()
                    .expect("a valid instant"),
            ),
            kept_answer: Some(KeptAnswer {
                text: "{\"amount\":40}\n1,40,1,5,-1".to_owned(),
                expires_at_ms: 1_790_000_000_000,
            }),
        }
    }

    /// [`hold_entry`] with its counters alone as its detail, as entries without a hold
    /// expiry or a kept answer are written.
    fn charge_entry() -> LedgerEntry {
        LedgerEntry {
            kind: EntryKind::Charge,
            hold_id: None,
            consumption_id: Some(ConsumptionId::new()),
            hold_expires_at: None,
            kept_answer: None,
            ..hold_entry()
        }
    }

    #[test]
    fn every_record_reads_back_what_was_written() {
        let entry = hold_entry();
        assert_eq!(decode_entry(&encode_entry(&entry)), Ok(entry.clone()));
        let refund = LedgerEntry {
            kind: EntryKind::Refund,
            counters: Vec::new(),
            hold_id: None,
            consumption_id: Some(ConsumptionId::new()),
            hold_expires_at: None,
            kept_answer: None,
            ..entry.clone()
        };
        // As the stores keep it: the entry, then the refunded total.
        let kept = format!("{}\n40", encode_entry(&refund));
        assert_eq!(decode_refund_record(&kept), Ok(refund));
        assert_eq!(
            read_detail(&entry, encode_detail(&entry).as_deref()),
            Ok(Detail::of(&entry))
        );
        let charge = charge_entry();
        assert_eq!(decode_entry(&encode_entry(&charge)), Ok(charge.clone()));
        assert_eq!(
            read_detail(&charge, encode_detail(&charge).as_deref()),
            Ok(Detail::of(&charge))
        );
        let bare = LedgerEntry {
            counters: Vec::new(),
            ..charge
        };
        assert_eq!(encode_detail(&bare), None);
        assert_eq!(
            decode_policies(
                &encode_policies(&entry.policies, entry.amount),
                entry.amount
            ),
            Ok(entry.policies.clone())
        );
        let hold = HoldRecord {
            action: entry.action.clone(),
            subject: entry.subject.clone(),
            amount: 40,
            expires_at_ms: 1_234,
            counters: entry.counters.clone(),
            attributes: entry.attributes.clone(),
        };
        let kept = format!("open\n{}", encode_hold_record(&hold));
        assert_eq!(decode_hold_record(&kept), Ok(hold));
        let consume = ConsumeRecord {
            consumption_id: None,
            hold: entry.hold_id.map(|id| (id, 99)),
            amount: 40,
            at_ms: 7,
            policies: vec![KeptPolicy {
                policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
                measure: Measure::Amount,
                mode: Mode::Shadow,
                limit: 100,
                window_seconds: 86_400,
                scope: org_scope(),
            }],
            attributes: entry.attributes.clone(),
        };
        assert_eq!(
            decode_consume_record(&encode_consume_record(&consume)),
            Ok(consume)
        );
    }

    /// Reads `detail` back as the SQL ledger does, beside the other columns of `entry`.
    fn read_detail(entry: &LedgerEntry, detail: Option<&str>) -> Result<Detail, CodecError> {
        let id = entry.id.to_string();
        let parts = EntryParts {
            id: &id,
            at: entry.at,
            kind: entry.kind.as_str(),
            action: entry.action.as_str(),
            subject: entry.subject.as_str(),
            amount: entry.amount,
            consumption_id: None,
            hold_id: None,
            idempotency_key: None,
        };
        decode_detail(detail, &parts, &entry.policies)
    }

    /// A charge of three budgets (the subject's, its country's, the action's), as the
    /// benchmark's consumes write them.
    fn three_budget_charge() -> LedgerEntry {
        let scopes = [
            Scope::default(),
            Scope::parse("scope", &["country"]).expect("a scope"),
            Scope::parse::<&str>("scope", &[]).expect("the global scope"),
        ];
        let ids = ["sms-user", "sms-country", "sms-global"];
        let keys = [
            "ql{0}3WpQuJy1xWRaS",
            "ql{h}vr35NHZ1xWRaS",
            "ql{V}fzeT3mC1xWRaS",
        ];
        let subject_key = |head: &str, i: usize| match i {
            0 => format!("{head}sms|u24399"),
            1 => format!("{head}sms|NG"),
            _ => format!("{head}sms|"),
        };
        let policies: Vec<PolicyAmount> = ids
            .iter()
            .zip(&scopes)
            .map(|(id, scope)| PolicyAmount {
                policy_id: PolicyId::parse("policy_id", id).expect("an id"),
                amount: 1,
                scope: scope.clone(),
            })
            .collect();
        LedgerEntry {
            action: Action::parse("action", "sms").expect("an action"),
            subject: Subject::parse("subject", "u24399").expect("a subject"),
            amount: 1,
            attributes: Attributes::parse("attributes", [("country".to_owned(), "NG".to_owned())])
                .expect("attributes"),
            counters: policies
                .iter()
                .enumerate()
                .map(|(i, p)| CounterCharge {
                    policy_id: p.policy_id.clone(),
                    key: subject_key(keys[i], i),
                    restore: Restore::Calendar {
                        period_end_ms: 1_795_755_600_000,
                    },
                    by_amount: false,
                    charged: 1,
                    scope: p.scope.clone(),
                })
                .collect(),
            policies,
            ..charge_entry()
        }
    }

    #[test]
    fn the_detail_column_is_compact_and_reads_back_with_its_row() {
        let charge = three_budget_charge();
        let compact = encode_detail(&charge).expect("a detail");
        assert_eq!(
            read_detail(&charge, Some(&compact)),
            Ok(Detail::of(&charge))
        );
        let json = to_json(&detail_wire(&Detail::of(&charge)).expect("a detail"));
        assert!(
            3 * compact.len() < json.len(),
            "{} bytes against {} as JSON: {compact:?}",
            compact.len(),
            json.len()
        );
        // Rows that earlier versions wrote hold JSON: still read, counters, a hold's expiry
        // and a kept answer alike.
        assert_eq!(read_detail(&charge, Some(&json)), Ok(Detail::of(&charge)));
        let hold = hold_entry();
        let json = to_json(&detail_wire(&Detail::of(&hold)).expect("a detail"));
        assert_eq!(read_detail(&hold, Some(&json)), Ok(Detail::of(&hold)));
        // A row's detail read beside another row's subject finds other counters: the keys
        // are relative to the row's own action and subject.
        let other = LedgerEntry {
            subject: Subject::parse("subject", "u1").expect("a subject"),
            ..charge.clone()
        };
        assert_ne!(read_detail(&other, Some(&compact)), Ok(Detail::of(&charge)));
        for bad in [
            "d1",
            "d1\u{1f}\u{1f}x",
            "d1\u{1f}9\u{1d}+k\u{1d}c1\u{1d}1\u{1d}",
        ] {
            assert!(read_detail(&charge, Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_policies_column_is_compact_and_reads_back_with_its_rows_amount() {
        let charge = three_budget_charge();
        let compact = encode_policies(&charge.policies, charge.amount);
        assert_eq!(
            decode_policies(&compact, charge.amount),
            Ok(charge.policies.clone())
        );
        let json = to_json(&policies_wire(&charge.policies));
        assert!(
            2 * compact.len() < json.len(),
            "{} bytes against {} as JSON: {compact:?}",
            compact.len(),
            json.len()
        );
        // Rows that earlier versions wrote hold JSON: still read.
        assert_eq!(
            decode_policies(&json, charge.amount),
            Ok(charge.policies.clone())
        );
        // A policy's own amount, apart from the entry's, is kept as such; the others follow
        // the row's amount.
        let mut policies = charge.policies.clone();
        policies[0].amount = charge.amount + 5;
        let compact = encode_policies(&policies, charge.amount);
        assert_eq!(
            decode_policies(&compact, charge.amount),
            Ok(policies.clone())
        );
        let read = decode_policies(&compact, charge.amount + 1).expect("policies");
        assert_eq!(read[0].amount, charge.amount + 5);
        assert_eq!(read[1].amount, charge.amount + 1);
        assert_eq!(decode_policies(&encode_policies(&[], 3), 3), Ok(Vec::new()));
        for bad in [
            "p1",
            "p1\u{1f}p",
            "p1\u{1f}p\u{1d}x",
            "p1\u{1f}Bad Id\u{1d}",
        ] {
            assert!(decode_policies(bad, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_entry_keeps_its_counters_as_an_array_and_reads_the_earlier_string_form() {
        let entry = charge_entry();
        assert_eq!(decode_entry(&encode_entry_json(&entry)), Ok(entry.clone()));
        let written: serde_json::Value =
            serde_json::from_str(&encode_entry_json(&entry)).expect("JSON");
        assert!(written["detail"].is_array(), "{written}");
        // What earlier versions appended: the counters as a JSON string inside the entry.
        let mut earlier = written.clone();
        earlier["detail"] = serde_json::Value::String(written["detail"].to_string());
        assert_eq!(decode_entry(&earlier.to_string()), Ok(entry));
    }

    #[test]
    fn a_single_policy_consume_waits_in_a_stream_entry_of_at_most_200_bytes() {
        let (action, subject) = ("payments.transfer", "customer-000123456");
        let policy_id = PolicyId::parse("policy_id", "transfers-rolling-24h").expect("an id");
        let entry = LedgerEntry {
            kind: EntryKind::Charge,
            action: Action::parse("action", action).expect("an action"),
            subject: Subject::parse("subject", subject).expect("a subject"),
            amount: 200_000,
            consumption_id: Some(ConsumptionId::new()),
            idempotency_key: Some(IdempotencyKey::parse("pay-2026-11-24-0001").expect("a key")),
            hold_id: None,
            hold_expires_at: None,
            kept_answer: None,
            policies: vec![PolicyAmount {
                policy_id: policy_id.clone(),
                amount: 200_000,
                scope: Scope::default(),
            }],
            attributes: Attributes::default(),
            counters: vec![CounterCharge {
                policy_id,
                // A rolling counter's key, as `crate::keys` lays it out.
                key: format!("ql:{{k}}AbCdEfG{action}|{subject}"),
                restore: Restore::Rolling {
                    bucket: 29_544_000,
                    bucket_ms: 60_000,
                    buckets: 1_440,
                },
                by_amount: true,
                charged: 200_000,
                scope: Scope::default(),
            }],
            ..hold_entry()
        };
        let compact = encode_entry(&entry);
        assert!(compact.len() <= 200, "{} bytes: {compact:?}", compact.len());
        assert!(encode_entry_json(&entry).len() > 2 * compact.len());
        assert_eq!(decode_entry(&compact), Ok(entry));
    }

    #[test]
    fn a_keyed_entry_carries_the_answer_kept_for_its_retries_in_compact_form() {
        let policies = vec![KeptPolicy {
            policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
            measure: Measure::Amount,
            mode: Mode::Shadow,
            limit: 100,
            window_seconds: 86_400,
            scope: org_scope(),
        }];
        for entry in [charge_entry(), hold_entry()] {
            let entry = LedgerEntry {
                kept_answer: None,
                ..entry
            };
            // What consume.lua appends: the evaluation's numbers.
            let text = format!(
                "{}1,40,1,5,-1",
                encode_entry_keeping(&entry, 1_790_000_000_000, &policies)
            );
            let decoded = decode_entry(&text).expect("reads back");
            let kept = decoded.kept_answer.clone().expect("a kept answer");
            assert_eq!(kept.expires_at_ms, 1_790_000_000_000);
            let (record, numbers) = kept.text.split_once('\n').expect("record, numbers");
            assert_eq!(numbers, "1,40,1,5,-1");
            let expected = ConsumeRecord {
                consumption_id: entry.consumption_id,
                hold: entry
                    .hold_id
                    .zip(entry.hold_expires_at.map(|at| at.timestamp_millis())),
                amount: entry.amount,
                at_ms: entry.at.timestamp_millis(),
                policies: policies.clone(),
                attributes: entry.attributes.clone(),
            };
            assert_eq!(decode_consume_record(record), Ok(expected));
            assert_eq!(
                LedgerEntry {
                    kept_answer: None,
                    ..decoded
                },
                entry
            );
        }
    }

    #[test]
    fn a_counter_of_an_unknown_kind_is_an_error_not_a_calendar_counter() {
        let text = r#"[{"policy_id":"p","key":"k","kind":5,"by_amount":true,"charged":1}]"#;
        assert!(decode_detail_json(text).is_err());
        let rolling_without_buckets =
            r#"[{"policy_id":"p","key":"k","kind":2,"span_ms":1000,"by_amount":true,"charged":1}]"#;
        assert!(decode_detail_json(rolling_without_buckets).is_err());
    }

    #[test]
    fn malformed_records_are_errors() {
        for text in ["", "open", "open\n{", "open\n{}"] {
            assert!(decode_hold_record(text).is_err(), "{text:?}");
        }
        let mut wire: serde_json::Value =
            serde_json::from_str(&encode_entry_json(&hold_entry())).expect("JSON");
        wire["hold_id"] = "h-1".into();
        assert!(
            decode_entry(&wire.to_string()).is_err(),
            "a hold id must be <uuid>.<shard>"
        );
        assert!(decode_replay("{}").is_err(), "no numbers");
        assert!(decode_replay("{}\n1,x").is_err(), "numbers that are not");
    }
}
