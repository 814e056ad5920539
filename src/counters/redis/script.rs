//! The decision scripts, each a Lua file whose header documents its KEYS, ARGV and reply,
//! beside the Rust module that writes one typed call of it and reads its reply:
//! [`consume`] (a [`Consume`](crate::engine::store::Consume)), [`giveback`] (a
//! [`GiveBack`](crate::engine::store::GiveBack)) and [`finalize`] (a
//! [`Finalize`](crate::engine::store::Finalize)). What they share is here.

pub(super) mod consume;
pub(super) mod finalize;
pub(super) mod giveback;

pub(super) use super::generations::Floors;
use crate::engine::store::{Effects, LedgerAppend};
use crate::keys;
use redis::Cmd;

/// The epochs of the distinct shards of `keys`, in order of first appearance (one, unless
/// a decision charges budgets of several shards).
fn epochs_of<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut epochs: Vec<String> = Vec::with_capacity(1);
    for key in keys {
        let epoch = keys::epoch_of(key);
        if !epochs.contains(&epoch) {
            epochs.push(epoch);
        }
    }
    epochs
}

/// The ledger entries of `effects` as a script sees them: by their values, so not at all
/// when there is no entry to append (the allowed one, or with `denied_too` the denied one).
fn ledger_of(effects: &Effects, denied_too: bool) -> Option<&LedgerAppend> {
    effects.ledger.as_ref().filter(|ledger| {
        !ledger.allowed.is_empty()
            || (denied_too && ledger.denied.as_deref().is_some_and(|d| !d.is_empty()))
    })
}

/// The keys of a consume's effects, in the scripts' order: the idempotency record, the
/// ledger stream (of `ledger`, [`ledger_of`] the effects), the hold's record and the index
/// of holds (each when present).
fn push_effect_keys(call: &mut Cmd, effects: &Effects, ledger: Option<&LedgerAppend>) {
    if let Some(idem) = &effects.idempotency {
        call.arg(idem.key.as_str());
    }
    if let Some(ledger) = ledger {
        call.arg(ledger.stream.as_str());
    }
    if let Some(hold) = &effects.hold {
        call.arg(hold.record_key.as_str())
            .arg(hold.index_key.as_str());
    }
}

/// The idempotency record's two arguments (ttl, record), empty when there is none.
fn push_idempotency_args(call: &mut Cmd, effects: &Effects) {
    match &effects.idempotency {
        Some(idem) => call.arg(idem.ttl_ms).arg(idem.record.as_str()),
        None => call.arg("").arg(""),
    };
}

/// The hold's four arguments (id, expiry, record, ttl), empty when there is none.
fn push_hold_args(call: &mut Cmd, effects: &Effects) {
    match &effects.hold {
        Some(hold) => call
            .arg(hold.hold_id.as_str())
            .arg(hold.expires_at_ms)
            .arg(hold.record.as_str())
            .arg(hold.ttl_ms),
        None => call.arg("").arg("").arg("").arg(""),
    };
}

/// The scripts' last argument: the floors of the write generations of `epochs`' shards
/// (`generations.rs`), or nothing without epochs.
fn floors_arg(floors: Option<&Floors>, epochs: &[String]) -> String {
    floors.map_or_else(String::new, |floors| {
        floors.argument(epochs.iter().map(String::as_str))
    })
}

/// The shard of `key`, for [`StoreError::Rebuilding`].
fn shard_of(key: &str) -> u16 {
    keys::shard_of(key).unwrap_or(0)
}

#[cfg(test)]
pub(super) mod tests;
