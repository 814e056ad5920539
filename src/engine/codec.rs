//! The one codec of every record the engine persists outside SQL.
//!
//! | record | where | format |
//! |---|---|---|
//! | an idempotency record | the counter store, under `keys::SubjectKeys::idempotency` | the engine's record, `\n`, then the evaluation's numbers (written by `consume.lua` or the memory store through [`encode_replay`]) |
//!
//! The Lua scripts write the same formats; a change here is a change there.

use super::store::{Decided, Evaluation, Outcome, StoreError};
use crate::domain::LedgerEntry;

/// A kept idempotency record: the engine's record and the evaluation it was answered with,
/// as `consume.lua` keeps them (`record\nallowed,used,allowed,resets_at,retry_at,…`).
pub fn encode_replay(record: &str, evaluation: &Evaluation) -> String {
    format!("{record}\n{}", reply_numbers(evaluation))
}

/// The reply numbers of an evaluation, as the script formats them for an idempotency record.
fn reply_numbers(evaluation: &Evaluation) -> String {
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
pub fn decode_replay(text: &str) -> Result<Decided, StoreError> {
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

/// A ledger entry as the consume and give-back scripts append it to a stream.
pub fn encode_entry(entry: &LedgerEntry) -> String {
    // Serializing plain structs of strings and numbers cannot fail.
    serde_json::to_string(entry).unwrap_or_default()
}

/// Reads a stream entry written by [`encode_entry`].
pub fn decode_entry(text: &str) -> Result<LedgerEntry, serde_json::Error> {
    serde_json::from_str(text)
}
