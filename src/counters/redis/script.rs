//! The decision scripts: building their `EVALSHA` calls and reading their replies.
//!
//! `scripts/consume.lua`, `scripts/giveback.lua` and `scripts/finalize.lua` document their
//! KEYS, ARGV and replies in their headers; this file is their Rust side.

use super::generations::Floors;
use crate::engine::codec;
use crate::engine::store::{
    signed, Algorithm, Charge, Decided, Effects, Evaluation, Finalize, Finalized, GiveBack,
    GiveBackKind, GivenBack, OnCrossing, Outcome, Restore, StoreError,
};
use crate::keys;
use redis::{Cmd, Script, Value};
use std::fmt::Write as _;

/// The decision script; its header documents KEYS, ARGV and the reply.
pub(super) const CONSUME_LUA: &str = include_str!("scripts/consume.lua");

/// The give-back script (refunds, hold settlement); its header documents KEYS and ARGV.
pub(super) const GIVEBACK_LUA: &str = include_str!("scripts/giveback.lua");

/// The commit point of a consume across Redis Cluster slots; its header documents it.
pub(super) const FINALIZE_LUA: &str = include_str!("scripts/finalize.lua");

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

/// The keys of a consume's effects, in the scripts' order: the idempotency record, the
/// ledger stream, the hold's record and the index of holds (each when present).
fn push_effect_keys(call: &mut Cmd, effects: &Effects) {
    if let Some(idem) = &effects.idempotency {
        call.arg(idem.key.as_str());
    }
    if let Some(ledger) = &effects.ledger {
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

/// The EVALSHA call for one decision. `Cmd` writes every argument into one buffer, sized up
/// front: two allocations per decision (a `ScriptInvocation` would make one per argument).
#[expect(
    clippy::too_many_lines,
    reason = "the script's arguments in the order its header documents them, into one buffer"
)]
pub(super) fn consume_cmd(
    script: &Script,
    now_ms: i64,
    charges: &[Charge],
    commit: bool,
    effects: &Effects,
    (floors, deadline_ms): (Option<&Floors>, Option<i64>),
) -> Cmd {
    let keys: usize = charges.iter().map(|c| c.key.as_str().len()).sum();
    let extra = effects.ledger.as_ref().map_or(0, |l| l.allowed.len() + 64)
        + effects
            .idempotency
            .as_ref()
            .map_or(0, |i| i.record.len() + i.key.len())
        + effects.hold.as_ref().map_or(0, |h| h.record.len() + 128);
    let mut call = Cmd::with_capacity(
        16 + 7 * charges.len(),
        128 + keys + 64 * charges.len() + extra,
    );
    let extra_keys = usize::from(effects.idempotency.is_some())
        + usize::from(effects.ledger.is_some())
        + 2 * usize::from(effects.hold.is_some())
        + 2 * usize::from(effects.intent.is_some())
        + usize::from(effects.reservation.is_some());
    // The epoch of every shard the call touches: its charges' and its effects' (home).
    let home = effects
        .idempotency
        .as_ref()
        .map(|i| i.key.as_str())
        .or(effects.ledger.as_ref().map(|l| l.stream.as_str()))
        .or(effects.hold.as_ref().map(|h| h.record_key.as_str()))
        .or(effects.intent.as_ref().map(|i| i.key.as_str()))
        .or(effects.reservation.as_ref().map(|r| r.key.as_str()));
    let epoch_keys = match floors {
        Some(_) => epochs_of(
            home.into_iter()
                .chain(charges.iter().map(|c| c.key.as_str())),
        ),
        None => Vec::new(),
    };
    call.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(charges.len() + extra_keys + epoch_keys.len());
    for charge in charges {
        call.arg(charge.key.as_str());
    }
    push_effect_keys(&mut call, effects);
    if let Some(intent) = &effects.intent {
        call.arg(intent.key.as_str()).arg(intent.index_key.as_str());
    }
    if let Some(reservation) = &effects.reservation {
        call.arg(reservation.key.as_str());
    }
    for epoch in &epoch_keys {
        call.arg(epoch.as_str());
    }
    // ARGV layout (see the script's header): now, commit, six values per charge, effects.
    call.arg(now_ms).arg(u8::from(commit));
    for charge in charges {
        let (kind, p1, p2) = match charge.algorithm {
            Algorithm::Calendar { period_end_ms } => (1, period_end_ms, 0),
            Algorithm::Rolling { bucket_ms, buckets } => (2, bucket_ms, buckets),
            Algorithm::TokenBucket { period_ms } => (3, period_ms, 0),
            Algorithm::Lifetime => (6, 0, 0),
            Algorithm::ZonedCalendar { period_end_ms } => (4, period_end_ms, 0),
            Algorithm::Request => (5, 0, 0),
        };
        call.arg(kind)
            .arg(p1)
            .arg(p2)
            .arg(charge.limit)
            .arg(charge.cost)
            .arg(u8::from(charge.enforce));
    }
    let flag = |on: bool| if on { '1' } else { '0' };
    let flags: String = [
        flag(effects.idempotency.is_some()),
        flag(effects.ledger.is_some()),
        flag(effects.hold.is_some()),
        flag(effects.intent.is_some()),
        flag(effects.reservation.is_some()),
        flag(effects.ledger.as_ref().is_some_and(|l| l.keeps_answer)),
    ]
    .into_iter()
    .collect();
    call.arg(flags);
    push_idempotency_args(&mut call, effects);
    match &effects.ledger {
        // An entry that keeps its answer only on a crossing is given plain; its kept
        // start follows the levels in `on crossing`.
        Some(ledger) => call
            .arg(
                &ledger.allowed
                    [..crossing_of(effects).map_or(ledger.allowed.len(), |on| on.plain_len)],
            )
            .arg(ledger.denied.as_deref().unwrap_or("")),
        None => call.arg("").arg(""),
    };
    push_hold_args(&mut call, effects);
    match (&effects.intent, &effects.reservation) {
        (Some(intent), _) => call
            .arg(intent.member.as_str())
            .arg(intent.deadline_ms)
            .arg(intent.record.as_str()),
        (None, Some(reservation)) => call
            .arg(reservation.call_now_ms)
            .arg(reservation.deadline_ms)
            .arg(""),
        (None, None) => call.arg("").arg("").arg(""),
    };
    match deadline_ms {
        Some(deadline_ms) => call.arg(deadline_ms),
        None => call.arg(""),
    };
    call.arg(on_crossing_arg(effects));
    call.arg(floors_arg(floors, &epoch_keys));
    call
}

/// The scripts' last argument: the floors of the write generations of `epochs`' shards
/// (`generations.rs`), or nothing without epochs.
fn floors_arg(floors: Option<&Floors>, epochs: &[String]) -> String {
    floors.map_or_else(String::new, |floors| {
        floors.argument(epochs.iter().map(String::as_str))
    })
}

/// What tells the script the alert levels of an entry that keeps its answer only when a
/// decision crosses one (none for a keyed consume: its entry always keeps it).
fn crossing_of(effects: &Effects) -> Option<&OnCrossing> {
    effects
        .ledger
        .as_ref()
        .filter(|l| l.keeps_answer && effects.idempotency.is_none())
        .and_then(|l| l.on_crossing.as_ref())
}

/// The script's `on crossing` value: `<charge>:<level>,…;<kept start>` (charges from 1,
/// the kept start being what follows the plain entry in the keeping one), or empty when
/// the entry keeps its answer whatever the decision.
fn on_crossing_arg(effects: &Effects) -> String {
    let (Some(on), Some(ledger)) = (crossing_of(effects), effects.ledger.as_ref()) else {
        return String::new();
    };
    let kept = &ledger.allowed[on.plain_len..];
    let mut out = String::with_capacity(8 * on.levels.len() + 1 + kept.len());
    for (j, (i, level)) in on.levels.iter().enumerate() {
        let comma = if j > 0 { "," } else { "" };
        let _ = write!(out, "{comma}{}:{level}", i + 1);
    }
    out.push(';');
    out.push_str(kept);
    out
}

/// The EVALSHA call of the finalize script.
pub(super) fn finalize_cmd(
    script: &Script,
    now_ms: i64,
    request: &Finalize,
    floors: Option<&Floors>,
) -> Cmd {
    let effects = &request.effects;
    let mut call = Cmd::with_capacity(24, 1024);
    let keys = 2
        + usize::from(effects.idempotency.is_some())
        + usize::from(effects.ledger.is_some())
        + 2 * usize::from(effects.hold.is_some())
        + usize::from(floors.is_some());
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    call.arg(request.intent.key.as_str())
        .arg(request.intent.index_key.as_str());
    push_effect_keys(&mut call, effects);
    let epoch_keys: Vec<String> = floors
        .map(|_| keys::epoch_of(&request.intent.key))
        .into_iter()
        .collect();
    for epoch in &epoch_keys {
        call.arg(epoch.as_str());
    }
    let flag = |on: bool| if on { '1' } else { '0' };
    let flags: String = [
        flag(effects.idempotency.is_some()),
        flag(effects.ledger.is_some()),
        flag(effects.hold.is_some()),
        flag(effects.ledger.as_ref().is_some_and(|l| l.keeps_answer)),
    ]
    .into_iter()
    .collect();
    call.arg(now_ms)
        .arg(request.intent.member.as_str())
        .arg(flags);
    push_idempotency_args(&mut call, effects);
    call.arg(effects.ledger.as_ref().map_or("", |l| l.allowed.as_str()))
        .arg(request.numbers.as_str());
    push_hold_args(&mut call, effects);
    call.arg(floors_arg(floors, &epoch_keys));
    call
}

/// Reads the finalize script's reply.
pub(super) fn parse_finalized(reply: Value, intent_key: &str) -> Result<Finalized, StoreError> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1)] => Ok(Finalized::Committed),
            [Value::Int(0)] => Ok(Finalized::Aborted),
            [Value::Int(-2)] => Err(StoreError::Rebuilding {
                shard: shard_of(intent_key),
            }),
            [Value::Int(-1), Value::BulkString(bytes)] => Ok(Finalized::Replayed(
                String::from_utf8_lossy(bytes).into_owned(),
            )),
            _ => Err(StoreError::Protocol(
                "finalize.lua replied something unexpected".into(),
            )),
        },
        _ => Err(StoreError::Protocol(
            "finalize.lua replied something other than an array".into(),
        )),
    }
}

/// The EVALSHA call of the give-back script.
#[expect(
    clippy::too_many_lines,
    reason = "the script's arguments in the order its header documents them, into one buffer"
)]
pub(super) fn giveback_cmd(
    script: &Script,
    now_ms: i64,
    request: &GiveBack,
    floors: Option<&Floors>,
) -> Cmd {
    let mut call = Cmd::with_capacity(24 + 7 * request.counters.len(), 1024);
    let extra_keys = usize::from(request.hold_index.is_some())
        + usize::from(request.ledger.is_some())
        + usize::from(request.idempotency.is_some())
        + 2 * usize::from(request.pending.is_some());
    let epoch_keys = match floors {
        Some(_) => epochs_of(
            std::iter::once(request.control_key.as_str())
                .chain(request.counters.iter().map(|c| c.key.as_str())),
        ),
        None => Vec::new(),
    };
    call.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(request.counters.len() + 1 + extra_keys + epoch_keys.len());
    for counter in &request.counters {
        call.arg(counter.key.as_str());
    }
    call.arg(request.control_key.as_str());
    if let Some((index, _)) = &request.hold_index {
        call.arg(index.as_str());
    }
    if let Some((stream, _)) = &request.ledger {
        call.arg(stream.as_str());
    }
    if let Some(idem) = &request.idempotency {
        call.arg(idem.key.as_str());
    }
    if let Some(pending) = &request.pending {
        call.arg(pending.key.as_str())
            .arg(pending.index_key.as_str());
    }
    for epoch in &epoch_keys {
        call.arg(epoch.as_str());
    }
    let (op, total, amount, refunded, hold_expiry) = match request.kind {
        GiveBackKind::Refund {
            amount,
            total,
            refunded,
        } => ("r", total, signed(amount), refunded, 0),
        GiveBackKind::Commit {
            settle,
            total,
            expires_at_ms,
        } => ("c", total, signed(settle), 0, expires_at_ms),
        GiveBackKind::Release {
            total,
            expires_at_ms,
        } => ("l", total, 0, 0, expires_at_ms),
        GiveBackKind::Expire {
            total,
            expires_at_ms,
        } => ("x", total, 0, 0, expires_at_ms),
        GiveBackKind::Void { total } => ("v", total, 0, 0, 0),
        GiveBackKind::VoidHold {
            total,
            expires_at_ms,
        } => ("w", total, 0, 0, expires_at_ms),
        GiveBackKind::Abandon => ("a", 0, 0, 0, 0),
        GiveBackKind::Undo => ("u", 0, 0, 0, 0),
        GiveBackKind::Resolved => ("d", 0, 0, 0, 0),
        GiveBackKind::RestoreOnce { full, by_amount } => ("f", u64::from(full), by_amount, 0, 0),
    };
    call.arg(now_ms)
        .arg(op)
        .arg(request.counters.len())
        .arg(total)
        .arg(amount)
        .arg(refunded)
        .arg(hold_expiry)
        .arg(
            request
                .hold_index
                .as_ref()
                .map_or("", |(_, id)| id.as_str()),
        )
        .arg(
            request
                .ledger
                .as_ref()
                .map_or("", |(_, entry)| entry.as_str()),
        );
    match &request.idempotency {
        Some(idem) => call.arg(idem.ttl_ms).arg(idem.record.as_str()),
        None => call.arg(0).arg(""),
    };
    let flag = |on: bool| u8::from(on);
    call.arg(flag(request.hold_index.is_some()))
        .arg(flag(request.ledger.is_some()))
        .arg(flag(request.idempotency.is_some()))
        .arg(flag(request.reports_usage));
    for counter in &request.counters {
        let (kind, p1, p2, p3) = match counter.restore {
            // Both an integer whose time to live (if any) the give-back keeps.
            Restore::Calendar { .. } | Restore::Lifetime => (1, 0, 0, 0),
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            } => (2, bucket, bucket_ms, buckets),
            Restore::TokenBucket { period_ms, limit } => (3, period_ms, limit as i64, 0),
            Restore::ZonedCalendar { charged_at_ms, .. } => (4, charged_at_ms, 0, 0),
        };
        call.arg(kind)
            .arg(p1)
            .arg(p2)
            .arg(p3)
            .arg(u8::from(counter.by_amount))
            .arg(counter.charged);
    }
    match &request.pending {
        Some(pending) => call
            .arg(1)
            .arg(pending.member.as_str())
            .arg(pending.deadline_ms)
            .arg(pending.record.as_str()),
        None => call.arg(0).arg("").arg("").arg(""),
    };
    call.arg(floors_arg(floors, &epoch_keys));
    call
}

/// The shard of `key`, for [`StoreError::Rebuilding`].
fn shard_of(key: &str) -> u16 {
    keys::shard_of(key).unwrap_or(0)
}

/// Reads the consume script's reply: a replay (`[-1, record]`), a shard without its epoch
/// (`[-2]`), a refused reservation (`[-3]`), a call run past its deadline (`[-4]`) or a
/// fresh evaluation.
pub(super) fn parse_decided(reply: Value, charges: &[Charge]) -> Result<Decided, StoreError> {
    if let Value::Array(items) = &reply {
        if let [Value::Int(-2)] = items.as_slice() {
            let shard = charges.first().map_or(0, |c| c.key.shard());
            return Err(StoreError::Rebuilding { shard });
        }
        if let [Value::Int(-3)] = items.as_slice() {
            return Ok(Decided::Refused);
        }
        if let [Value::Int(-4)] = items.as_slice() {
            return Err(StoreError::Timeout(
                "Redis ran the call after its deadline: nothing was decided".into(),
            ));
        }
        if let [Value::Int(-1), kept] = items.as_slice() {
            let text = match kept {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => {
                    return Err(StoreError::Protocol(
                        "consume.lua replayed a non-string".into(),
                    ))
                }
            };
            return codec::decode_replay(&text);
        }
    }
    parse_reply(reply, charges).map(Decided::Fresh)
}

/// Reads the give-back script's reply `[status, value]` (and the usage report, when asked) to a give-back on `control_key`'s
/// shard.
pub(super) fn parse_given_back(reply: Value, control_key: &str) -> Result<GivenBack, StoreError> {
    let unexpected = |what: &str| StoreError::Protocol(format!("giveback.lua replied {what}"));
    let Value::Array(items) = reply else {
        return Err(unexpected("something other than an array"));
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::Int(n) => Ok(n.to_string()),
        _ => Err(unexpected("an unexpected value")),
    };
    match items.as_slice() {
        [Value::Int(1), Value::Int(total)] => Ok(GivenBack::Done {
            refunded: u64::try_from(*total).unwrap_or(0),
            restored: Vec::new(),
            usage: String::new(),
        }),
        [Value::Int(1), Value::Int(total), usage] => Ok(GivenBack::Done {
            refunded: u64::try_from(*total).unwrap_or(0),
            restored: Vec::new(),
            usage: text(usage)?,
        }),
        [Value::Int(2), value] => Ok(GivenBack::Conflict(text(value)?)),
        [Value::Int(3), value] => Ok(GivenBack::Replayed(text(value)?)),
        [Value::Int(4), _] => Ok(GivenBack::Unknown),
        [Value::Int(5), _] => Err(StoreError::Rebuilding {
            shard: shard_of(control_key),
        }),
        _ => Err(unexpected("an unknown status")),
    }
}

/// Reads the script's reply: `[allowed_all, (used, allowed, resets_at, retry_at) per charge]`.
fn parse_reply(reply: Value, charges: &[Charge]) -> Result<Evaluation, StoreError> {
    let unexpected = |what: &str| StoreError::Protocol(format!("consume.lua replied {what}"));
    let Value::Array(items) = reply else {
        return Err(unexpected("something other than an array"));
    };
    if items.len() != 1 + 4 * charges.len() {
        return Err(unexpected("an array of the wrong length"));
    }
    let mut numbers = items.into_iter().map(|item| match item {
        Value::Int(n) => Ok(n),
        _ => Err(unexpected("a non-integer element")),
    });
    let mut next = move || {
        numbers
            .next()
            .unwrap_or_else(|| Err(unexpected("too few elements")))
    };
    let flag = |n: i64| match n {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(unexpected("a flag other than 0 or 1")),
    };
    let allowed = flag(next()?)?;
    let mut outcomes = Vec::with_capacity(charges.len());
    for charge in charges {
        let used = u64::try_from(next()?).map_err(|_| unexpected("a negative usage"))?;
        let passes = flag(next()?)?;
        let resets_at_ms = next()?;
        let retry_at_ms = next()?;
        outcomes.push(Outcome {
            used,
            allowed: passes,
            resets_at_ms,
            // The -1 placeholder is never read: cost and limit tell whether there is a time
            // (and a lifetime never has one).
            retry_at_ms: (!passes
                && charge.cost <= charge.limit
                && charge.algorithm != Algorithm::Lifetime)
                .then_some(retry_at_ms),
        });
    }
    Ok(Evaluation { allowed, outcomes })
}

#[cfg(test)]
pub(super) mod tests;
