//! Undoing and confirming a change of the in-process store whose ledger entry could not
//! be, or was, committed (`engine::unit`): the store's side of `Undoable::undo` and
//! `Undoable::confirm`.

use std::collections::HashMap;

use super::counting::{self, Entry};
use super::giveback::REFUNDED_TTL_MS;
use crate::engine::store::{GiveBackKind, Undo};

/// What an idempotency record kept as in flight starts with, until confirmed: no record
/// the engine encodes starts with a NUL.
pub(super) const PENDING: &str = "\u{0}pending\n";

/// Keeps for good the kept answer of a change whose ledger entry was committed.
pub(super) fn confirm_in(entries: &mut HashMap<String, Entry>, now_ms: i64, change: &Undo) {
    let Undo::Charge {
        idempotency: Some(key),
        ..
    } = change
    else {
        return;
    };
    let confirmed = counting::text(entries.get(key), now_ms)
        .and_then(|text| text.strip_prefix(PENDING))
        .map(str::to_owned);
    if let (Some(text), Some(entry)) = (confirmed, entries.get_mut(key)) {
        counting::replace_text(entry, text);
    }
}

/// Every key undoing a charge touches (a give-back's are `give_back_keys`).
pub(super) fn undo_keys(undo: &Undo) -> Vec<&str> {
    let mut keys = Vec::new();
    if let Undo::Charge {
        counters,
        idempotency,
        hold,
    } = undo
    {
        keys.extend(counters.iter().map(|c| c.key.as_str()));
        keys.extend(idempotency.as_deref());
        if let Some((record, (index, _))) = hold {
            keys.extend([record.as_str(), index.as_str()]);
        }
    }
    keys
}

/// Takes back a change whose ledger entry could not be committed (see [`Undo`]).
pub(super) fn undo_in(entries: &mut HashMap<String, Entry>, now_ms: i64, undo: &Undo) {
    match undo {
        Undo::Charge {
            counters,
            idempotency,
            hold,
        } => {
            for counter in counters.iter().filter(|c| c.charged > 0) {
                counting::restore(
                    entries.get_mut(&counter.key),
                    &counter.restore,
                    counter.charged,
                    now_ms,
                );
            }
            if let Some(key) = idempotency {
                entries.remove(key);
            }
            if let Some((record, (index, hold_id))) = hold {
                entries.remove(record);
                counting::index_remove(entries, index, hold_id);
            }
        }
        Undo::GiveBack {
            request,
            refunded,
            restored,
        } => {
            for (counter, took) in request.counters.iter().zip(restored) {
                let entry = entries.get_mut(&counter.key);
                match *took {
                    took if took > 0 => {
                        counting::take(entry, &counter.restore, took.unsigned_abs(), now_ms);
                    }
                    took if took < 0 => {
                        counting::untake(entry, &counter.restore, took.unsigned_abs(), now_ms);
                    }
                    _ => {}
                }
            }
            match request.kind {
                GiveBackKind::Refund { amount, .. } => counting::set_text(
                    entries,
                    &request.control_key,
                    refunded.saturating_sub(amount).to_string(),
                    now_ms + REFUNDED_TTL_MS,
                ),
                GiveBackKind::Commit { expires_at_ms, .. }
                | GiveBackKind::Release { expires_at_ms, .. }
                | GiveBackKind::Expire { expires_at_ms, .. }
                | GiveBackKind::VoidHold { expires_at_ms, .. } => {
                    if let Some(entry) = entries.get_mut(&request.control_key) {
                        let reopened = counting::text(Some(entry), now_ms)
                            .and_then(|text| text.split_once('\n'))
                            .map(|(_, rest)| format!("open\n{rest}"));
                        if let Some(text) = reopened {
                            counting::replace_text(entry, text);
                        }
                    }
                    if let Some((index, hold_id)) = &request.hold_index {
                        counting::index_add(entries, index, hold_id, expires_at_ms);
                    }
                }
                _ => {}
            }
            if let Some(idem) = &request.idempotency {
                entries.remove(&idem.key);
            }
        }
    }
}
