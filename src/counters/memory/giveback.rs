//! Give-backs in the in-process store (refunds, settlements, expiries, voids, and the
//! steps across slots), as `redis/script/giveback.lua` applies them.

use std::collections::HashMap;

use super::counting::{self, Entry, State};
use crate::engine::store::{signed, GiveBack, GiveBackKind, GivenBack, Restore, StoreError};
use std::fmt::Write as _;

/// Every key a give-back touches (and its undo too).
pub(super) fn give_back_keys(request: &GiveBack) -> Vec<&str> {
    let mut keys = vec![request.control_key.as_str()];
    keys.extend(request.counters.iter().map(|c| c.key.as_str()));
    keys.extend(request.hold_index.as_ref().map(|(index, _)| index.as_str()));
    keys.extend(request.idempotency.as_ref().map(|i| i.key.as_str()));
    keys
}

/// What a give-back returns to `counter`: count policies their charge when the whole
/// charge goes back (`full`), amount policies up to `by_amount`; below zero, what the
/// counter is charged more (`by_amount` below zero: an over-capture's excess).
pub(super) fn given_back(
    counter: &crate::domain::CounterCharge,
    full: bool,
    by_amount: i64,
) -> i64 {
    let charged = i64::try_from(counter.charged).unwrap_or(i64::MAX);
    match (counter.by_amount, full) {
        (true, _) => by_amount.min(charged),
        (false, true) => charged,
        (false, false) => 0,
    }
}

/// A give-back, on the shard holding every key it touches.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per give-back kind, as `giveback.lua` has them, so the two stores read side by side"
)]
pub(super) fn give_back_in(
    entries: &mut HashMap<String, Entry>,
    now_ms: i64,
    request: &GiveBack,
) -> Result<GivenBack, StoreError> {
    if let Some(idem) = &request.idempotency {
        if let Some(kept) = counting::text(entries.get(&idem.key), now_ms) {
            return Ok(GivenBack::Replayed(kept.to_owned()));
        }
    }
    let step = match request.kind {
        GiveBackKind::Abandon
        | GiveBackKind::Undo
        | GiveBackKind::Resolved
        | GiveBackKind::RestoreOnce { .. } => {
            return Err(StoreError::Protocol(
                "the in-process store decides across shards atomically: nothing to undo".to_owned(),
            ))
        }
        GiveBackKind::Refund {
            amount,
            total,
            refunded,
        } => refund_step(
            entries,
            &request.control_key,
            now_ms,
            amount,
            total,
            refunded,
        ),
        GiveBackKind::Commit {
            settle,
            total,
            expires_at_ms,
        } => settle_step(
            entries,
            request,
            now_ms,
            (
                "committed",
                false,
                signed(total) - signed(settle),
                expires_at_ms,
            ),
        ),
        GiveBackKind::Release {
            total,
            expires_at_ms,
        } => settle_step(
            entries,
            request,
            now_ms,
            ("released", true, signed(total), expires_at_ms),
        ),
        GiveBackKind::Expire {
            total,
            expires_at_ms,
        } => settle_step(
            entries,
            request,
            now_ms,
            ("expired", true, signed(total), expires_at_ms),
        ),
        // Replays record voids as a refund or release (`engine::rebuild`); nothing here is
        // ever in doubt, but the arithmetic is the same.
        GiveBackKind::Void { total } => Ok((true, signed(total), 0)),
        GiveBackKind::VoidHold {
            total,
            expires_at_ms,
        } => settle_step(
            entries,
            request,
            now_ms,
            ("voided", true, signed(total), expires_at_ms),
        ),
    };
    let (full, by_amount_gets, result) = match step {
        Ok(step) => step,
        Err(answer) => return Ok(answer),
    };
    let mut restored = Vec::with_capacity(request.counters.len());
    let mut usage = String::new();
    for counter in &request.counters {
        let give = given_back(counter, full, by_amount_gets);
        let before = match request.reports_usage && give != 0 {
            true => usage_of(entries.get(&counter.key), &counter.restore, now_ms),
            false => 0,
        };
        let entry = entries.get_mut(&counter.key);
        restored.push(match give {
            0 => 0,
            give if give > 0 => signed(counting::restore(
                entry,
                &counter.restore,
                give.unsigned_abs(),
                now_ms,
            )),
            excess => -signed(counting::charge_more(
                entry,
                &counter.restore,
                excess.unsigned_abs(),
                now_ms,
            )),
        });
        if request.reports_usage {
            let after = match give {
                0 => 0,
                _ => usage_of(entries.get(&counter.key), &counter.restore, now_ms),
            };
            let separator = if usage.is_empty() { "" } else { ";" };
            let _ = write!(usage, "{separator}{before},{after}");
        }
    }
    if matches!(request.kind, GiveBackKind::Refund { .. }) {
        counting::set_text(
            entries,
            &request.control_key,
            result.to_string(),
            now_ms + REFUNDED_TTL_MS,
        );
    }
    if let Some(idem) = &request.idempotency {
        let kept = format!("{}\n{result}", idem.record);
        counting::set_text(entries, &idem.key, kept, now_ms + idem.ttl_ms);
    }
    Ok(GivenBack::Done {
        refunded: result,
        restored,
        usage,
    })
}

/// A counter's usage as a decision at `now_ms` reads it (`counting::read`): a calendar or
/// lifetime counter's units; the units of the zoned period a charge at `charged_at_ms`
/// went to, while it runs; a rolling window's live buckets; a token bucket's level drained
/// to now, in units, rounded up. A counter that no longer counts has none.
fn usage_of(entry: Option<&Entry>, restore: &Restore, now_ms: i64) -> u64 {
    let Some(entry) = entry.filter(|e| e.is_live(now_ms)) else {
        return 0;
    };
    match (&entry.state, restore) {
        (State::Counter(units), Restore::Calendar { .. } | Restore::Lifetime) => *units,
        (State::Text(text), Restore::ZonedCalendar { charged_at_ms, .. }) => {
            match counting::zoned_period(text) {
                Some((used, start, end)) if (start..end).contains(charged_at_ms) => used,
                _ => 0,
            }
        }
        (
            State::Buckets(held),
            Restore::Rolling {
                bucket_ms, buckets, ..
            },
        ) => {
            let lowest = now_ms.div_euclid(*bucket_ms) - buckets;
            held.iter()
                .filter(|(index, _)| *index >= lowest)
                .map(|(_, units)| units)
                .sum()
        }
        (State::Gcra { s, t }, Restore::TokenBucket { period_ms, limit }) => {
            let drained = match *t > now_ms {
                true => 0,
                false => u128::try_from(now_ms - *t).unwrap_or(0) * u128::from((*limit).max(1)),
            };
            let level = u128::from(*s).saturating_sub(drained);
            let period = u128::try_from(*period_ms).unwrap_or(1).max(1);
            u64::try_from(level.div_ceil(period)).unwrap_or(u64::MAX)
        }
        _ => 0,
    }
}

/// What a give-back returns to its counters: whether count policies get their charge back
/// (`full`), what amount policies get (below zero: what they are charged more), and the
/// refunded total after it (refunds; else 0).
type Step = (bool, i64, u64);

/// A refund of `amount` out of `total`: refused (a conflict) when it would exceed the
/// charge, counting what the store's running total (or else the ledger) says was refunded.
fn refund_step(
    entries: &HashMap<String, Entry>,
    control_key: &str,
    now_ms: i64,
    amount: u64,
    total: u64,
    refunded: u64,
) -> Result<Step, GivenBack> {
    let before = counting::text(entries.get(control_key), now_ms)
        .and_then(|t| t.parse().ok())
        .unwrap_or(refunded);
    if before + amount > total {
        return Err(GivenBack::Conflict(before.to_string()));
    }
    Ok((before + amount == total, signed(amount), before + amount))
}

/// The settlement (commit, release) or expiry of an open hold, `settlement` being its new
/// state, whether count policies get their charge back, what amount policies get, and the
/// hold's expiry: moves its record to the new state and drops it from the index of open holds; refused unless the hold is open,
/// and (for expiry) due, or (for settlement) not yet expired.
fn settle_step(
    entries: &mut HashMap<String, Entry>,
    request: &GiveBack,
    now_ms: i64,
    settlement: (&str, bool, i64, i64),
) -> Result<Step, GivenBack> {
    let Some(record) = counting::text(entries.get(&request.control_key), now_ms) else {
        if let Some((index, hold_id)) = &request.hold_index {
            counting::index_remove(entries, index, hold_id);
        }
        return Err(GivenBack::Unknown);
    };
    let state = record.split('\n').next().unwrap_or("").to_owned();
    if state != "open" {
        return Err(GivenBack::Conflict(state));
    }
    let (new_state, full, gets, expires_at_ms) = settlement;
    let expire = new_state == "expired";
    if !expire && now_ms >= expires_at_ms {
        return Err(GivenBack::Conflict("expired".to_owned()));
    }
    if expire && now_ms < expires_at_ms {
        return Err(GivenBack::Conflict("open".to_owned()));
    }
    let rest = record[state.len()..].to_owned();
    if let Some(entry) = entries.get_mut(&request.control_key) {
        counting::replace_text(entry, format!("{new_state}{rest}"));
    }
    if let Some((index, hold_id)) = &request.hold_index {
        counting::index_remove(entries, index, hold_id);
    }
    Ok((full, gets, 0))
}

/// How long a refunded total is kept (30 days), as in giveback.lua.
pub(super) const REFUNDED_TTL_MS: i64 = 2_592_000_000;
