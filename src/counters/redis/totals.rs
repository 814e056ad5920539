//! The Redis side of the consumes recorded in the ledger's totals: each shard's hash of
//! those waiting (`keys::totals_waiting`, filled by `consume.lua`), handed to the drain
//! and ended once in SQL (`move.lua`, `moved.lua`).

use super::RedisCounterStore;
use crate::engine::pipeline::stream::Moving;
use crate::engine::store::StoreError;
use crate::keys;
use redis::Value;

/// Hands out a shard's waiting consumes; its header documents KEYS, ARGV and the reply.
const MOVE_LUA: &str = include_str!("script/move.lua");

/// Ends a move; its header documents KEYS, ARGV and the reply.
const MOVED_LUA: &str = include_str!("script/moved.lua");

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl RedisCounterStore {
    pub(super) async fn move_shard_totals(&self, shard: u16) -> Result<Option<Moving>, StoreError> {
        let waiting = keys::totals_waiting(&self.prefix, shard);
        // Sent whole (EVAL), like the acknowledgement: no script cache to miss.
        let mut call = redis::cmd("EVAL");
        call.arg(MOVE_LUA)
            .arg(3)
            .arg(&waiting)
            .arg(keys::totals_moving(&self.prefix, shard))
            .arg(keys::generation(&self.prefix, shard));
        let reply: Value = self.query(&call).await?;
        let Value::Array(parts) = reply else {
            return Err(StoreError::Protocol("move.lua: not an array".into()));
        };
        let (Some(Value::Int(generation)), Some(Value::Array(hash))) =
            (parts.first(), parts.get(1))
        else {
            return Ok(None);
        };
        let resumed = matches!(parts.get(2), Some(Value::Int(1)));
        let fields = hash
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
            .collect();
        self.entries_replicated(&waiting).await?;
        Ok(Some(Moving {
            generation: u64::try_from(*generation).unwrap_or(0),
            fields,
            resumed,
        }))
    }

    pub(super) async fn end_shard_move(&self, shard: u16, content: &str) -> Result<(), StoreError> {
        let mut call = redis::cmd("EVAL");
        call.arg(MOVED_LUA)
            .arg(2)
            .arg(keys::totals_moving(&self.prefix, shard))
            .arg(keys::deletes_held(&self.prefix, shard))
            .arg(content);
        let _: Value = self.query(&call).await?;
        Ok(())
    }

    pub(super) async fn shard_totals_hold(&self, shard: u16, id: &str) -> Result<bool, StoreError> {
        for key in [
            keys::totals_waiting(&self.prefix, shard),
            keys::totals_moving(&self.prefix, shard),
        ] {
            let mut call = redis::cmd("HEXISTS");
            call.arg(key).arg(id);
            if self.query::<bool>(&call).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub(super) async fn shard_totals_len(&self, shard: u16) -> Result<u64, StoreError> {
        let mut len = 0;
        for key in [
            keys::totals_waiting(&self.prefix, shard),
            keys::totals_moving(&self.prefix, shard),
        ] {
            let mut call = redis::cmd("HLEN");
            call.arg(key);
            // The content's `#` is no consume.
            len += self.query::<u64>(&call).await?.saturating_sub(1);
        }
        Ok(len)
    }
}
