//! The Rust side of `giveback.lua` (refunds, hold settlement, voids, the cross-slot
//! give-backs): [`command`] writes a [`GiveBack`] as the script's header documents,
//! [`given_back`] reads its reply. The in-process store gives back the same [`GiveBack`]
//! (`counters::memory::giveback`).

use super::{epochs_of, floors_arg, shard_of, Floors};
use crate::engine::store::{signed, GiveBack, GiveBackKind, GivenBack, Restore, StoreError};
use redis::{Cmd, Script, Value};

/// The give-back script (refunds, hold settlement); its header documents KEYS and ARGV.
pub(in crate::counters::redis) const LUA: &str = include_str!("giveback.lua");

/// The EVALSHA call of the give-back script.
#[expect(
    clippy::too_many_lines,
    reason = "the script's arguments in the order its header documents them, into one buffer"
)]
pub(in crate::counters::redis) fn command(
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

/// Reads the give-back script's reply `[status, value]` (and the usage report, when
/// asked) to a give-back on `control_key`'s shard.
pub(in crate::counters::redis) fn given_back(
    reply: Value,
    control_key: &str,
) -> Result<GivenBack, StoreError> {
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
