//! The codecs of every record the engine persists, besides the counters themselves: one
//! module per record.
//!
//! | record | kept in | format | module |
//! |---|---|---|---|
//! | a consume's idempotency record | the counter store (`keys::SubjectKeys::idempotency`) | [`ConsumeRecord`] as JSON, then `\n` and the evaluation's numbers | `replay` |
//! | a hold's record | the counter store (`keys::hold_record`) | its state (`open`, `committed`, …), `\n`, then [`HoldRecord`] as JSON | `hold` |
//! | an intent (a consume across Redis Cluster slots) | the counter store (`keys::intent`) | state, epoch and deadline lines, then [`IntentRecord`] as JSON | `intent` |
//! | a ledger entry | the shard's Redis stream (field `e`); a refund's idempotency record | [`LedgerEntry`] in its compact form, version `3` | `stream`, `entry` |
//! | an entry's row | the SQL ledger: its columns, `policies` (version `p1`) and `detail` (version `d1`) | [`EntryParts`], and fields of the compact form | `row`, `fields` |
//! | the in-process counters | the `counter_snapshots` table | binary parts, [`SNAPSHOT_FORMAT`] | `snapshot` |
//!
//! The Lua scripts (`crate::counters`) and the memory store write the envelopes (the state
//! line, the evaluation's numbers) the same way; a change here is a change there. Each
//! compact text starts with its version; a reader refuses another. Nothing was released
//! before 0.1.0, so these read only the formats 0.1.0 writes.

use super::store::StoreError;
use crate::domain::{Attributes, Scope};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod columns;
mod counter;
mod entry;
mod fields;
mod hold;
mod intent;
mod replay;
mod row;
mod snapshot;
mod stream;
#[cfg(test)]
pub(in crate::engine) mod tests;

pub(crate) use columns::{
    attributes_column, attributes_from_column, policies_column, policies_from_column,
    totals_column, totals_from_column, AttributesColumn, PoliciesColumn,
};
pub(crate) use hold::{decode_hold_record, encode_hold_record, HoldRecord};
pub(crate) use intent::{decode_intent, encode_intent, IntentRecord};
pub(crate) use replay::{
    decode_consume_record, decode_replay, encode_consume_record, encode_replay, reply_numbers,
    ConsumeRecord, KeptPolicy, KeptTerms,
};
pub(crate) use row::{decode_detail, decode_policies, encode_detail, entry_from_parts, EntryParts};
pub(crate) use snapshot::{
    decode_delta, decode_snapshot, encode_delta, encode_snapshot, item_bytes, DELTA_FORMAT,
    SNAPSHOT_FORMAT,
};
pub use stream::encode_entry;
pub(crate) use stream::{
    decode_entries, decode_entry, decode_refund_record, encode_entries, encode_entry_keeping,
};

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

fn field<T, E: std::fmt::Display>(
    what: &'static str,
    parsed: Result<T, E>,
) -> Result<T, CodecError> {
    parsed.map_err(|e| CodecError::new(what, e))
}
