//! A consume across Redis Cluster slots keeps, in its intent, what undoing it takes.

use super::counter::{decode_counter_wires, CounterWire};
use super::{from_json, to_json, CodecError};
use crate::domain::CounterCharge;
use serde::{Deserialize, Serialize};

/// What undoing a consume across Redis Cluster slots takes: the counters it charges at
/// home and in each foreign shard (`engine::crossslot`), kept in its intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IntentRecord {
    /// The home shard's counters.
    pub(crate) home: Vec<CounterCharge>,
    /// Each foreign shard's counters, in reservation order.
    pub(crate) foreign: Vec<(u16, Vec<CounterCharge>)>,
    /// A give-back's pending share: per foreign shard whose counters alert, its entry
    /// keeping their policies (`Engine::foreign_alerts`).
    pub(crate) alerts: Vec<(u16, String)>,
}

#[derive(Serialize, Deserialize)]
struct IntentWire {
    home: Vec<CounterWire>,
    foreign: Vec<(u16, Vec<CounterWire>)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    alerts: Vec<(u16, String)>,
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
        alerts: record.alerts.clone(),
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
        alerts: wire.alerts,
    };
    Ok((state, record))
}
