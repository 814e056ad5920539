//! A keyed consume's idempotency record, as the counter store keeps it: the engine's
//! [`ConsumeRecord`] as JSON, then `\n` and the evaluation's numbers, which `consume.lua`
//! appends (or [`encode_replay`] does, for the memory store).

use super::{
    attributes_from_wire, attributes_wire, field, from_json, scope_from_wire, scope_wire, to_json,
};
use super::{AttributesWire, CodecError};
use crate::domain::{
    Attributes, ConsumptionId, HoldId, LedgerEntry, Measure, Mode, PolicyId, Scope,
};
use crate::engine::store::{Decided, Evaluation, Outcome, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Its alert thresholds then: the entry's answer tells which it crossed.
    pub(crate) alert_thresholds: crate::domain::Thresholds,
}

impl ConsumeRecord {
    /// The record of `entry`'s consume or hold, decided at `at_ms` with `policies`.
    pub(crate) fn of_entry(entry: &LedgerEntry, at_ms: i64, policies: Vec<KeptPolicy>) -> Self {
        Self {
            consumption_id: entry.consumption_id,
            hold: entry
                .hold_id
                .zip(entry.hold_expires_at.map(|at| at.timestamp_millis())),
            amount: entry.amount,
            at_ms,
            policies,
            attributes: entry.attributes.clone(),
        }
    }
}

impl KeptPolicy {
    /// What a stream entry keeps of it (its id and scope are the entry's own).
    pub(crate) fn terms(&self) -> KeptTerms<'_> {
        KeptTerms {
            measure: self.measure,
            mode: self.mode,
            limit: self.limit,
            window_seconds: self.window_seconds,
            thresholds: self.alert_thresholds.percents(),
        }
    }
}

/// The part of a [`KeptPolicy`] a stream entry keeps, borrowed: an alerting consume
/// writes it from its plan's policies without copying them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeptTerms<'a> {
    pub(crate) measure: Measure,
    pub(crate) mode: Mode,
    pub(crate) limit: u64,
    pub(crate) window_seconds: u64,
    pub(crate) thresholds: &'a [u8],
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    alerts: Vec<u8>,
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
                alerts: p.alert_thresholds.percents().to_vec(),
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
                    alert_thresholds: thresholds(WHAT, &p.alerts)?,
                })
            })
            .collect::<Result<_, CodecError>>()?,
        attributes: attributes_from_wire(WHAT, wire.attributes)?,
    })
}

/// Alert thresholds as a record keeps them.
pub(super) fn thresholds(
    what: &'static str,
    percents: &[u8],
) -> Result<crate::domain::Thresholds, CodecError> {
    let percents: Vec<i64> = percents.iter().map(|&p| i64::from(p)).collect();
    crate::domain::Thresholds::parse("alert_thresholds", &percents)
        .map_err(|e| CodecError::new(what, e.message))
}
