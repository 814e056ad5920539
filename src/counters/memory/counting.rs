//! The three counting algorithms of the in-process store, line for line the arithmetic of
//! `redis/script/consume.lua` (see its header and `mod.rs` for the semantics).
//!
//! A decision runs in two passes: [`read`] decides one charge from the current state and
//! prepares its [`Write`] without touching anything; [`apply`] performs the write once every
//! charge of the decision is known to pass. All quantities are at most 2^53 - 1 and all times
//! within ±2^51 ms (checked by `check_charges`), so none of the sums below can overflow.

use std::collections::HashMap;

use crate::engine::store::{
    Algorithm, Charge, Outcome, Restore, StoreError, KEY_GRACE_MS, MAX_UNITS, NEVER_MS,
};

mod held;
pub(super) use held::{charge_more, restore, take, untake};

/// 2^53 - 1 as a time: reported times of a saturated shadow token bucket are clamped to it,
/// as in the script.
const MAX_MS: i64 = (1 << 53) - 1;

/// One counter: its state and the (test-clock) time after which it is gone.
#[derive(Debug)]
pub(super) struct Entry {
    /// What is counted.
    pub(super) state: State,
    /// Last millisecond at which the entry exists (Redis drops a key once `now > expiry`).
    pub(super) expires_at_ms: i64,
}

impl Entry {
    /// An entry holding `state` until `expires_at_ms`.
    pub(super) fn new(state: State, expires_at_ms: i64) -> Self {
        Self {
            state,
            expires_at_ms,
        }
    }

    /// Whether the entry still exists at `now_ms`.
    pub(super) fn is_live(&self, now_ms: i64) -> bool {
        now_ms <= self.expires_at_ms
    }

    /// Number of rolling buckets held (0 for other kinds), for tests.
    #[cfg(test)]
    pub(super) fn bucket_count(&self) -> usize {
        match &self.state {
            State::Buckets(buckets) => buckets.len(),
            _ => 0,
        }
    }
}

/// The state of one counter, one variant per algorithm (the Redis value types in comments).
#[derive(Debug)]
pub(super) enum State {
    /// Calendar: units used in the period (a string holding an integer).
    Counter(u64),
    /// Rolling: (bucket index, units), ascending by index (a hash of index -> units).
    Buckets(Vec<(i64, u64)>),
    /// Token bucket: `s` = used × period_ms as of time `t` (a string "s:t").
    Gcra {
        /// Used × period_ms.
        s: u64,
        /// As of this time, Unix ms.
        t: i64,
    },
    /// A record: idempotency answers, holds, refunded totals (a string).
    Text(String),
    /// Open holds by expiry: member -> score (a sorted set).
    Index(std::collections::BTreeMap<String, i64>),
}

/// What pass 1 learned about one charge.
#[derive(Debug)]
pub(super) struct Reading {
    /// The outcome if the decision is not applied (denied or a peek).
    pub(super) outcome: Outcome,
    /// What applying would write; `None` when applying changes nothing (cost 0, or usage
    /// already saturated at 2^53 - 1).
    pub(super) write: Option<Write>,
}

/// The effect of applying one charge.
#[derive(Debug)]
pub(super) struct Write {
    /// Usage after applying.
    pub(super) used: u64,
    /// When usage would be back to zero after applying.
    pub(super) resets_at_ms: i64,
    /// The entry's new expiry (the key's TTL).
    expires_at_ms: i64,
    /// How the state changes.
    change: Change,
}

/// How applying changes a counter's state.
#[derive(Debug)]
enum Change {
    /// Store this many units (calendar).
    Counter(u64),
    /// Drop buckets below `oldest_live`, add `delta` to bucket `current` (rolling).
    Rolling {
        delta: u64,
        current: i64,
        oldest_live: i64,
    },
    /// Store this GCRA state (token bucket).
    Gcra { s: u64, t: i64 },
    /// Store this zoned period, as the string `used:start:end` (zoned calendar).
    Zoned(String),
}

/// Pass 1: decides `charge` at `now_ms` from `entry` (absent or expired means no usage).
pub(super) fn read(
    entry: Option<&Entry>,
    now_ms: i64,
    charge: &Charge,
) -> Result<Reading, StoreError> {
    let state = entry.map(|e| &e.state);
    let (limit, cost) = (charge.limit, charge.cost);
    match charge.algorithm {
        Algorithm::Calendar { period_end_ms } => {
            calendar(state, now_ms, period_end_ms, limit, cost)
        }
        Algorithm::Rolling { bucket_ms, buckets } => {
            rolling(state, now_ms, (bucket_ms, buckets), limit, cost)
        }
        Algorithm::TokenBucket { period_ms } => token_bucket(state, now_ms, period_ms, limit, cost),
        Algorithm::ZonedCalendar { period_end_ms } => {
            zoned_calendar(state, now_ms, period_end_ms, limit, cost)
        }
        Algorithm::Lifetime => lifetime(state, limit, cost),
        // A per-request maximum reads and writes nothing: its usage is the request's cost.
        Algorithm::Request => Ok(Reading {
            outcome: Outcome {
                used: cost,
                allowed: cost <= limit,
                resets_at_ms: now_ms,
                retry_at_ms: None,
            },
            write: None,
        }),
    }
}

/// A zoned period's `(used, start_ms, end_ms)` from its string, as consume.lua writes it.
pub(super) fn zoned_period(text: &str) -> Option<(u64, i64, i64)> {
    let mut parts = text.split(':');
    let used = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((used, start, end))
}

/// A calendar period in the request's zone: the running period (`now < end`) whatever the
/// zone, else a new one from `now` to `period_end_ms`.
fn zoned_calendar(
    state: Option<&State>,
    now_ms: i64,
    period_end_ms: i64,
    limit: u64,
    cost: u64,
) -> Result<Reading, StoreError> {
    let (used, start, end) = match state {
        None => (0, now_ms, period_end_ms),
        Some(State::Text(text)) => match zoned_period(text).ok_or_else(wrong_type)? {
            (used, start, end) if now_ms < end => (used, start, end),
            _ => (0, now_ms, period_end_ms),
        },
        Some(_) => return Err(wrong_type()),
    };
    Ok(period(used, now_ms, end, (limit, cost), |after| {
        Change::Zoned(format!("{after}:{start}:{end}"))
    }))
}

/// A period's reading (calendar, zoned): `used` so far, the period ending at `end_ms`;
/// `change` is the state that holds `after` units.
fn period(
    used: u64,
    now_ms: i64,
    end_ms: i64,
    (limit, cost): (u64, u64),
    change: impl FnOnce(u64) -> Change,
) -> Reading {
    let fits = cost <= limit; // the charge can pass at all
    let allowed = fits && used <= limit - cost;
    let write = (cost > 0 && used < MAX_UNITS).then(|| {
        let after = (used + cost).min(MAX_UNITS);
        Write {
            used: after,
            resets_at_ms: end_ms,
            expires_at_ms: now_ms + (end_ms - now_ms).max(0) + KEY_GRACE_MS,
            change: change(after),
        }
    });
    let outcome = Outcome {
        used,
        allowed,
        resets_at_ms: if used > 0 { end_ms } else { now_ms },
        retry_at_ms: (!allowed && fits).then_some(end_ms),
    };
    Reading { outcome, write }
}

/// A calendar period: one integer, reset by the caller moving to the next period's key.
fn calendar(
    state: Option<&State>,
    now_ms: i64,
    period_end_ms: i64,
    limit: u64,
    cost: u64,
) -> Result<Reading, StoreError> {
    let used = match state {
        None => 0,
        Some(State::Counter(units)) => *units,
        Some(_) => return Err(wrong_type()),
    };
    Ok(period(
        used,
        now_ms,
        period_end_ms,
        (limit, cost),
        Change::Counter,
    ))
}

/// A lifetime counter: one integer that never expires, nor resets (no retry time).
fn lifetime(state: Option<&State>, limit: u64, cost: u64) -> Result<Reading, StoreError> {
    let used = match state {
        None => 0,
        Some(State::Counter(units)) => *units,
        Some(_) => return Err(wrong_type()),
    };
    let write = (cost > 0 && used < MAX_UNITS).then(|| {
        let after = (used + cost).min(MAX_UNITS);
        Write {
            used: after,
            resets_at_ms: NEVER_MS,
            expires_at_ms: i64::MAX,
            change: Change::Counter(after),
        }
    });
    let outcome = Outcome {
        used,
        allowed: cost <= limit && used <= limit - cost,
        resets_at_ms: NEVER_MS,
        retry_at_ms: None,
    };
    Ok(Reading { outcome, write })
}

/// A rolling window: units per bucket; buckets `>= current - buckets` count.
fn rolling(
    state: Option<&State>,
    now_ms: i64,
    (bucket_ms, buckets): (i64, i64),
    limit: u64,
    cost: u64,
) -> Result<Reading, StoreError> {
    let fits = cost <= limit;
    let held: &[(i64, u64)] = match state {
        None => &[],
        Some(State::Buckets(held)) => held,
        Some(_) => return Err(wrong_type()),
    };
    let current = now_ms.div_euclid(bucket_ms);
    let oldest_live = current - buckets;
    // A bucket stops counting at the start of bucket `index + buckets + 1`.
    let ends_at = |index: i64| (index + buckets + 1) * bucket_ms;
    let live = || held.iter().filter(move |(index, _)| *index >= oldest_live);
    let used = live().fold(0u64, |sum, (_, units)| sum.saturating_add(*units));
    let newest = live()
        .filter(|(_, units)| *units > 0)
        .map(|(index, _)| *index)
        .max();
    let allowed = fits && used <= limit - cost;
    let mut retry_at_ms = None;
    if !allowed && fits {
        let mut rest = used;
        for (index, units) in live().filter(|(_, units)| *units > 0) {
            rest = rest.saturating_sub(*units);
            if rest <= limit - cost {
                retry_at_ms = Some(ends_at(*index));
                break;
            }
        }
    }
    let write = (cost > 0 && used < MAX_UNITS).then(|| {
        let delta = cost.min(MAX_UNITS - used);
        let resets_at_ms = ends_at(newest.map_or(current, |n| n.max(current)));
        Write {
            used: used + delta,
            resets_at_ms,
            expires_at_ms: resets_at_ms + KEY_GRACE_MS,
            change: Change::Rolling {
                delta,
                current,
                oldest_live,
            },
        }
    });
    let outcome = Outcome {
        used,
        allowed,
        resets_at_ms: match newest {
            Some(index) if used > 0 => ends_at(index),
            _ => now_ms,
        },
        retry_at_ms,
    };
    Ok(Reading { outcome, write })
}

/// A token bucket (GCRA): `s` = used × period_ms, draining by `limit` per ms.
fn token_bucket(
    state: Option<&State>,
    now_ms: i64,
    period_ms: i64,
    limit: u64,
    cost: u64,
) -> Result<Reading, StoreError> {
    let fits = cost <= limit;
    let (stored, t) = match state {
        None => (0, now_ms),
        Some(State::Gcra { s, t }) => (*s, *t),
        Some(_) => return Err(wrong_type()),
    };
    // Checked positive and with limit × period_ms <= 2^53 - 1 by `check_charges`.
    let period = u64::try_from(period_ms).unwrap_or(u64::MAX);
    // `s` drains by `limit` per ms; a zero-limit bucket still drains, by 1 per ms.
    let rate = limit.max(1);
    let (s, t_ref) = if t > now_ms {
        (stored, t) // written by an instance whose clock runs ahead: nothing drained yet
    } else {
        let elapsed = u64::try_from(now_ms - t).unwrap_or(u64::MAX);
        match elapsed.checked_mul(rate) {
            Some(drained) if drained < stored => (stored - drained, now_ms),
            _ => (0, now_ms),
        }
    };
    let allowed = fits && s <= (limit - cost) * period;
    let write = (cost > 0 && s < MAX_UNITS).then(|| {
        // cost × period may not fit 2^53: compare through a division first.
        let after = match cost <= (MAX_UNITS - s) / period {
            true => s + cost * period,
            false => MAX_UNITS,
        };
        let resets_at_ms = later(t_ref, after.div_ceil(rate));
        Write {
            used: after.div_ceil(period),
            resets_at_ms,
            expires_at_ms: now_ms + (resets_at_ms - now_ms + KEY_GRACE_MS).min(MAX_MS),
            change: Change::Gcra { s: after, t: t_ref },
        }
    });
    let outcome = Outcome {
        used: s.div_ceil(period),
        allowed,
        resets_at_ms: if s > 0 {
            later(t_ref, s.div_ceil(rate))
        } else {
            now_ms
        },
        retry_at_ms: (!allowed && fits)
            .then(|| later(t_ref, (s - (limit - cost) * period).div_ceil(rate))),
    };
    Ok(Reading { outcome, write })
}

/// Pass 2: applies a charge's prepared write to the shard's entries.
pub(super) fn apply(
    entries: &mut HashMap<String, Entry>,
    charge: &Charge,
    now_ms: i64,
    write: Write,
) {
    let expires_at_ms = write.expires_at_ms;
    let state = match write.change {
        Change::Counter(units) => State::Counter(units),
        Change::Gcra { s, t } => State::Gcra { s, t },
        Change::Zoned(text) => State::Text(text),
        Change::Rolling {
            delta,
            current,
            oldest_live,
        } => {
            if let Some(entry) = entries
                .get_mut(charge.key.as_str())
                .filter(|e| e.is_live(now_ms))
            {
                if let State::Buckets(held) = &mut entry.state {
                    held.retain(|(index, _)| *index >= oldest_live);
                    match held.binary_search_by_key(&current, |(index, _)| *index) {
                        Ok(at) => held[at].1 += delta,
                        Err(at) => held.insert(at, (current, delta)),
                    }
                    entry.expires_at_ms = expires_at_ms;
                    return;
                }
            }
            State::Buckets(vec![(current, delta)])
        }
    };
    let entry = Entry {
        state,
        expires_at_ms,
    };
    match entries.get_mut(charge.key.as_str()) {
        Some(slot) => *slot = entry,
        None => {
            entries.insert(charge.key.as_str().to_owned(), entry);
        }
    }
}

/// `t + ms`, clamped to 2^53 - 1 like the script's times.
fn later(t: i64, ms: u64) -> i64 {
    t.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
        .min(MAX_MS)
}

/// The error for a key whose state belongs to another algorithm (Redis answers WRONGTYPE).
fn wrong_type() -> StoreError {
    StoreError::Protocol("a counter key holds the state of another algorithm".to_owned())
}

/// The text kept at a live record entry.
pub(super) fn text(entry: Option<&Entry>, now_ms: i64) -> Option<&str> {
    match entry.filter(|e| e.is_live(now_ms)).map(|e| &e.state) {
        Some(State::Text(text)) => Some(text),
        _ => None,
    }
}

/// Keeps `value` at `key` until `expires_at_ms` (SET … PX).
pub(super) fn set_text(
    entries: &mut HashMap<String, Entry>,
    key: &str,
    value: String,
    expires_at_ms: i64,
) {
    entries.insert(
        key.to_owned(),
        Entry {
            state: State::Text(value),
            expires_at_ms,
        },
    );
}

/// Replaces the text of a live record, keeping its expiry (SET … KEEPTTL).
pub(super) fn replace_text(entry: &mut Entry, value: String) {
    entry.state = State::Text(value);
}

/// Adds or moves `member` in the index at `key` (ZADD); indexes never expire.
pub(super) fn index_add(entries: &mut HashMap<String, Entry>, key: &str, member: &str, score: i64) {
    let entry = entries.entry(key.to_owned()).or_insert_with(|| Entry {
        state: State::Index(std::collections::BTreeMap::new()),
        expires_at_ms: i64::MAX,
    });
    if let State::Index(members) = &mut entry.state {
        members.insert(member.to_owned(), score);
    }
}

/// Removes `member` from the index at `key` (ZREM).
pub(super) fn index_remove(entries: &mut HashMap<String, Entry>, key: &str, member: &str) {
    if let Some(State::Index(members)) = entries.get_mut(key).map(|e| &mut e.state) {
        members.remove(member);
    }
}

/// Up to `limit` members scored at or before `now_ms`, lowest score first (ZRANGEBYSCORE).
pub(super) fn index_due(entry: Option<&Entry>, now_ms: i64, limit: usize) -> Vec<String> {
    let Some(State::Index(members)) = entry.map(|e| &e.state) else {
        return Vec::new();
    };
    let mut due: Vec<(i64, &String)> = members
        .iter()
        .filter(|(_, score)| **score <= now_ms)
        .map(|(member, score)| (*score, member))
        .collect();
    due.sort();
    due.into_iter()
        .take(limit)
        .map(|(_, m)| m.clone())
        .collect()
}

/// The earliest score of an index, if it has members.
pub(super) fn index_first(entry: Option<&Entry>) -> Option<i64> {
    let Some(State::Index(members)) = entry.map(|e| &e.state) else {
        return None;
    };
    members.values().copied().min()
}
