//! What the Redis streams (and a refund's idempotency record) hold: ledger entries in the
//! compact form of module `entry`, several to a stream entry when decided together.

use super::{entry, CodecError, KeptTerms};
use crate::domain::LedgerEntry;

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
/// for the evaluation's numbers, which `consume.lua` appends (see the module `entry`); and
/// the length of the entry's own compact form at its start (what [`encode_entry`] writes of
/// it without a kept answer).
pub(crate) fn encode_entry_keeping<'a>(
    entry: &LedgerEntry,
    kept_until_ms: i64,
    policies: impl IntoIterator<Item = KeptTerms<'a>>,
) -> (String, usize) {
    entry::encode_keeping(entry, kept_until_ms, policies)
}

/// Reads what [`encode_entry`] wrote.
pub(crate) fn decode_entry(text: &str) -> Result<LedgerEntry, CodecError> {
    entry::decode(text)
}

/// Reads a refund's idempotency record: its entry (anything after a last `\n` is the
/// store's).
pub(crate) fn decode_refund_record(text: &str) -> Result<LedgerEntry, CodecError> {
    let record = text.rsplit_once('\n').map_or(text, |(record, _)| record);
    decode_entry(record)
}
