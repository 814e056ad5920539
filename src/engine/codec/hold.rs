//! A hold's record in the counter store: `<state>\n`, then [`HoldRecord`] as JSON.

use super::counter::{decode_counter_wires, CounterWire};
use super::{attributes_from_wire, attributes_wire, field, from_json, to_json};
use super::{AttributesWire, CodecError};
use crate::domain::{Action, Attributes, CounterCharge, HoldId, Subject};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
