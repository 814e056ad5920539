//! Giving units back to a counter that still counts them, and undoing that: the arithmetic
//! of `redis/script/giveback.lua`.

use super::*;

/// Applies `change` to the units a live counter holds for `restore`: a calendar or
/// lifetime counter's, those of the period a zoned charge was made in, those of a rolling
/// bucket that still counts (and is there), or a token bucket's, drained to now first (its
/// units are unit-milliseconds: `change` is given the scale, `period_ms` per unit; 1 for
/// the others). Returns what `change` returns; 0, and nothing changed, for a counter that
/// no longer counts. One walk for the four give-back steps below, as giveback.lua has one.
fn on_held(
    entry: Option<&mut Entry>,
    restore: &Restore,
    now_ms: i64,
    change: impl FnOnce(&mut u64, u64) -> u64,
) -> u64 {
    let Some(entry) = entry.filter(|e| e.is_live(now_ms)) else {
        return 0;
    };
    match (&mut entry.state, restore) {
        (State::Counter(units), Restore::Calendar { .. } | Restore::Lifetime) => change(units, 1),
        (State::Text(text), Restore::ZonedCalendar { charged_at_ms, .. }) => {
            // Only the period the units were charged in counts them.
            match zoned_period(text) {
                Some((mut used, start, end)) if (start..end).contains(charged_at_ms) => {
                    let changed = change(&mut used, 1);
                    *text = format!("{used}:{start}:{end}");
                    changed
                }
                _ => 0,
            }
        }
        (
            State::Buckets(held),
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            },
        ) if *bucket >= now_ms.div_euclid(*bucket_ms) - buckets => {
            match held.binary_search_by_key(bucket, |(index, _)| *index) {
                Ok(at) => change(&mut held[at].1, 1),
                Err(_) => 0,
            }
        }
        (State::Gcra { s, t }, Restore::TokenBucket { period_ms, limit }) => {
            if *t <= now_ms {
                let drained =
                    u128::try_from(now_ms - *t).unwrap_or(0) * u128::from((*limit).max(1));
                *s = u64::try_from(u128::from(*s).saturating_sub(drained)).unwrap_or(0);
                *t = now_ms;
            }
            change(s, u64::try_from(*period_ms).unwrap_or(1))
        }
        _ => 0,
    }
}

/// `units` at `scale` (a token bucket's unit-milliseconds), saturating.
fn scaled(units: u64, scale: u64) -> u64 {
    u64::try_from(u128::from(units) * u128::from(scale)).unwrap_or(u64::MAX)
}

/// Takes up to `give` units off a live counter, as giveback.lua does (see [`on_held`]):
/// nothing goes below zero. Returns what it took, in the counter's own units
/// (unit-milliseconds for a token bucket), for [`take`] to put back exactly.
pub(in crate::counters::memory) fn restore(
    entry: Option<&mut Entry>,
    restore: &Restore,
    give: u64,
    now_ms: i64,
) -> u64 {
    on_held(entry, restore, now_ms, |held, scale| {
        let took = scaled(give, scale).min(*held);
        *held -= took;
        took
    })
}

/// Puts back on a live counter what [`restore`] took from it (`took`, in the counter's own
/// units): undoes a give-back whose ledger entry could not be committed. Counters that no
/// longer count (a period or bucket that ended) are left alone, as `restore` leaves them.
pub(in crate::counters::memory) fn take(
    entry: Option<&mut Entry>,
    restore: &Restore,
    took: u64,
    now_ms: i64,
) {
    on_held(entry, restore, now_ms, |held, _| {
        *held = held.saturating_add(took);
        0
    });
}

/// Charges `extra` more units to a live counter, as giveback.lua does for a negative
/// give-back (an over-capture's excess; see [`on_held`]), capped at 2^53 - 1. Returns what
/// it added, in the counter's own units, for [`untake`] to take off exactly.
pub(in crate::counters::memory) fn charge_more(
    entry: Option<&mut Entry>,
    restore: &Restore,
    extra: u64,
    now_ms: i64,
) -> u64 {
    on_held(entry, restore, now_ms, |held, scale| {
        let after = held
            .saturating_add(scaled(extra, scale))
            .min(MAX_UNITS)
            .max(*held);
        let added = after - *held;
        *held = after;
        added
    })
}

/// Takes off a live counter what [`charge_more`] added to it (`added`, in the counter's
/// own units): undoes an over-capture whose ledger entry could not be committed.
pub(in crate::counters::memory) fn untake(
    entry: Option<&mut Entry>,
    restore: &Restore,
    added: u64,
    now_ms: i64,
) {
    on_held(entry, restore, now_ms, |held, _| {
        *held = held.saturating_sub(added);
        0
    });
}
