//! The decision script's Rust side: [`command`] writes a [`Consume`] as `consume.lua`'s
//! header documents its KEYS and ARGV, [`decided`] reads its reply. The in-process store
//! decides the same [`Consume`] (`counters::memory`); the conformance suite runs both.

use super::{
    epochs_of, floors_arg, ledger_of, push_effect_keys, push_hold_args, push_idempotency_args,
    Floors,
};
use crate::engine::codec;
use crate::engine::store::{
    Algorithm, Charge, Consume, Decided, Effects, Evaluation, OnCrossing, Outcome, StoreError,
};
use redis::{Cmd, Script, Value};
use std::fmt::Write as _;

/// The decision script; its header documents KEYS, ARGV and the reply.
pub(in crate::counters::redis) const LUA: &str = include_str!("consume.lua");

/// The EVALSHA call for one decision. `Cmd` writes every argument into one buffer, sized up
/// front: two allocations per decision (a `ScriptInvocation` would make one per argument).
#[expect(
    clippy::too_many_lines,
    reason = "the script's arguments in the order its header documents them, into one buffer"
)]
pub(in crate::counters::redis) fn command(
    script: &Script,
    call: &Consume<'_>,
    (floors, deadline_ms): (Option<&Floors>, Option<i64>),
) -> Cmd {
    let (charges, effects) = (call.charges, call.effects);
    let ledger = ledger_of(effects, true);
    let keys: usize = charges.iter().map(|c| c.key.as_str().len()).sum();
    let extra = effects.ledger.as_ref().map_or(0, |l| l.allowed.len() + 64)
        + effects
            .idempotency
            .as_ref()
            .map_or(0, |i| i.record.len() + i.key.len())
        + effects.hold.as_ref().map_or(0, |h| h.record.len() + 128);
    let mut cmd = Cmd::with_capacity(
        16 + 7 * charges.len(),
        128 + keys + 64 * charges.len() + extra,
    );
    let extra_keys = usize::from(effects.idempotency.is_some())
        + usize::from(ledger.is_some())
        + usize::from(ledger.is_some_and(|l| l.totals.is_some()))
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
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(charges.len() + extra_keys + epoch_keys.len());
    for charge in charges {
        cmd.arg(charge.key.as_str());
    }
    push_effect_keys(&mut cmd, effects, ledger);
    if let Some(totals) = ledger.and_then(|l| l.totals.as_ref()) {
        cmd.arg(totals.key.as_str());
    }
    if let Some(intent) = &effects.intent {
        cmd.arg(intent.key.as_str()).arg(intent.index_key.as_str());
    }
    if let Some(reservation) = &effects.reservation {
        cmd.arg(reservation.key.as_str());
    }
    for epoch in &epoch_keys {
        cmd.arg(epoch.as_str());
    }
    // ARGV layout (see the script's header): now, commit, six values per charge, effects.
    cmd.arg(call.now_ms).arg(u8::from(call.commit));
    for charge in charges {
        let (kind, p1, p2) = match charge.algorithm {
            Algorithm::Calendar { period_end_ms } => (1, period_end_ms, 0),
            Algorithm::Rolling { bucket_ms, buckets } => (2, bucket_ms, buckets),
            Algorithm::TokenBucket { period_ms } => (3, period_ms, 0),
            Algorithm::Lifetime => (6, 0, 0),
            Algorithm::ZonedCalendar { period_end_ms } => (4, period_end_ms, 0),
            Algorithm::Request => (5, 0, 0),
        };
        cmd.arg(kind)
            .arg(p1)
            .arg(p2)
            .arg(charge.limit)
            .arg(charge.cost)
            .arg(u8::from(charge.enforce));
    }
    // Which effects the call carries, the script reads from their values (none is ever
    // empty when present); whether the entry keeps its answer is the one value of its own.
    let keeps_answer = effects.ledger.as_ref().is_some_and(|l| l.keeps_answer);
    cmd.arg(if keeps_answer { "1" } else { "" });
    push_idempotency_args(&mut cmd, effects);
    match ledger {
        // An entry that keeps its answer only on a crossing is given plain; its kept
        // start follows the levels in `on crossing`.
        Some(ledger) => cmd
            .arg(
                &ledger.allowed
                    [..crossing_of(effects).map_or(ledger.allowed.len(), |on| on.plain_len)],
            )
            .arg(ledger.denied.as_deref().unwrap_or("")),
        None => cmd.arg("").arg(""),
    };
    push_hold_args(&mut cmd, effects);
    match (&effects.intent, &effects.reservation) {
        (Some(intent), _) => cmd
            .arg(intent.member.as_str())
            .arg(intent.deadline_ms)
            .arg(intent.record.as_str()),
        (None, Some(reservation)) => cmd
            .arg(reservation.call_now_ms)
            .arg(reservation.deadline_ms)
            .arg(""),
        (None, None) => cmd.arg("").arg("").arg(""),
    };
    match deadline_ms {
        Some(deadline_ms) => cmd.arg(deadline_ms),
        None => cmd.arg(""),
    };
    cmd.arg(on_crossing_arg(effects));
    match ledger.and_then(|l| l.totals.as_ref()) {
        Some(totals) => cmd.arg(totals.id.as_str()),
        None => cmd.arg(""),
    };
    cmd.arg(floors_arg(floors, &epoch_keys));
    cmd
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

/// Reads the consume script's reply: a replay (`[-1, record]`), a shard without its epoch
/// (`[-2]`), a refused reservation (`[-3]`), a call run past its deadline (`[-4]`) or a
/// fresh evaluation.
pub(in crate::counters::redis) fn decided(
    reply: Value,
    charges: &[Charge],
) -> Result<Decided, StoreError> {
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

/// Reads the script's reply: `[allowed_all, (used, allowed, resets_at, retry_at) per charge]`.
pub(super) fn parse_reply(reply: Value, charges: &[Charge]) -> Result<Evaluation, StoreError> {
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
