//! The Rust side of `finalize.lua`, the commit point at home of a consume across Redis
//! Cluster slots: [`command`] writes a [`Finalize`] as the script's header documents,
//! [`finalized`] reads its reply. Only a Redis Cluster is asked (`engine::crossslot`).

use super::{
    floors_arg, ledger_of, push_effect_keys, push_hold_args, push_idempotency_args, shard_of,
    Floors,
};
use crate::engine::store::{Finalize, Finalized, StoreError};
use crate::keys;
use redis::{Cmd, Script, Value};

/// The commit point of a consume across Redis Cluster slots; its header documents it.
pub(in crate::counters::redis) const LUA: &str = include_str!("finalize.lua");

/// The EVALSHA call of the finalize script.
pub(in crate::counters::redis) fn command(
    script: &Script,
    now_ms: i64,
    request: &Finalize,
    floors: Option<&Floors>,
) -> Cmd {
    let effects = &request.effects;
    let ledger = ledger_of(effects, false);
    let mut call = Cmd::with_capacity(24, 1024);
    let keys = 2
        + usize::from(effects.idempotency.is_some())
        + usize::from(ledger.is_some())
        + 2 * usize::from(effects.hold.is_some())
        + usize::from(floors.is_some());
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    call.arg(request.intent.key.as_str())
        .arg(request.intent.index_key.as_str());
    push_effect_keys(&mut call, effects, ledger);
    let epoch_keys: Vec<String> = floors
        .map(|_| keys::epoch_of(&request.intent.key))
        .into_iter()
        .collect();
    for epoch in &epoch_keys {
        call.arg(epoch.as_str());
    }
    // As in consume.lua, the effects present are read from their values.
    let keeps_answer = effects.ledger.as_ref().is_some_and(|l| l.keeps_answer);
    call.arg(now_ms)
        .arg(request.intent.member.as_str())
        .arg(if keeps_answer { "1" } else { "" });
    push_idempotency_args(&mut call, effects);
    call.arg(ledger.map_or("", |l| l.allowed.as_str()))
        .arg(request.numbers.as_str());
    push_hold_args(&mut call, effects);
    call.arg(floors_arg(floors, &epoch_keys));
    call
}

/// Reads the finalize script's reply.
pub(in crate::counters::redis) fn finalized(
    reply: Value,
    intent_key: &str,
) -> Result<Finalized, StoreError> {
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
