//! The Redis side of the ledger drain: reading the per-shard ledger streams through a
//! consumer group, claiming what dead consumers left pending, and acknowledging.

use super::RedisCounterStore;
use crate::engine::pipeline::stream::{LedgerStream, Moving, Read, StreamEntry};
use crate::engine::store::StoreError;
use async_trait::async_trait;
use redis::Value;

/// The consumer group every instance's drain reads through.
pub(crate) const GROUP: &str = "ledger";

/// Acknowledges and deletes drained entries in one atomic step; its header documents KEYS,
/// ARGV and the reply.
const ACK_LUA: &str = include_str!("script/ack.lua");

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Parses `[[id, [field, value, …]], …]`, keeping the `e` field.
pub(super) fn entries(value: &Value) -> Vec<StreamEntry> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(parts) = item else {
                return None;
            };
            let id = text(parts.first()?)?;
            let Value::Array(fields) = parts.get(1)? else {
                return None;
            };
            let entry = fields
                .chunks(2)
                .find(|kv| kv.first().and_then(text).as_deref() == Some("e"))
                .and_then(|kv| kv.get(1).and_then(text))?;
            Some((id, entry))
        })
        .collect()
}

impl RedisCounterStore {
    /// Creates the consumer group of `stream` (and the stream) if missing.
    pub(crate) async fn ensure_group(&self, stream: &str) -> Result<(), StoreError> {
        let mut call = redis::cmd("XGROUP");
        call.arg("CREATE")
            .arg(stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.query::<Value>(&call).await {
            Ok(_) => Ok(()),
            Err(StoreError::Protocol(message)) if message.contains("BUSYGROUP") => Ok(()),
            Err(error) => Err(error),
        }
    }
}

#[async_trait]
impl LedgerStream for RedisCounterStore {
    /// Up to `count` entries of `stream` for `consumer`.
    async fn read_group(
        &self,
        stream: &str,
        consumer: &str,
        count: usize,
        read: Read<'_>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut call = redis::cmd("XREADGROUP");
        call.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(stream)
            .arg(match read {
                Read::PendingAfter(id) => id,
                Read::New => ">",
            });
        let reply = match self.query::<Value>(&call).await {
            Err(StoreError::Protocol(message)) if message.contains("NOGROUP") => {
                self.ensure_group(stream).await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        // [[stream, [[id, [f, v]], …]]] or nil.
        let Value::Array(streams) = reply else {
            return Ok(Vec::new());
        };
        let read = streams
            .first()
            .and_then(|s| match s {
                Value::Array(parts) => parts.get(1).map(entries),
                _ => None,
            })
            .unwrap_or_default();
        if !read.is_empty() {
            self.entries_replicated(stream).await?;
        }
        Ok(read)
    }

    /// Takes over up to `count` entries idle for at least `min_idle_ms` (their consumer died).
    async fn claim_idle(
        &self,
        stream: &str,
        consumer: &str,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut call = redis::cmd("XAUTOCLAIM");
        call.arg(stream)
            .arg(GROUP)
            .arg(consumer)
            .arg(min_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count);
        let reply = match self.query::<Value>(&call).await {
            Err(StoreError::Protocol(message)) if message.contains("NOGROUP") => {
                self.ensure_group(stream).await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        // [next id, [[id, [f, v]], …], [deleted ids]]
        let claimed = match reply {
            Value::Array(parts) => parts.get(1).map(entries).unwrap_or_default(),
            _ => Vec::new(),
        };
        if !claimed.is_empty() {
            self.entries_replicated(stream).await?;
        }
        Ok(claimed)
    }

    /// How many entries `stream` holds (all of them wait to be drained: drained ones are
    /// deleted).
    async fn stream_len(&self, stream: &str) -> Result<u64, StoreError> {
        let mut call = redis::cmd("XLEN");
        call.arg(stream);
        self.query(&call).await
    }

    async fn last_id(&self, stream: &str) -> Result<Option<String>, StoreError> {
        let mut call = redis::cmd("XREVRANGE");
        call.arg(stream).arg("+").arg("-").arg("COUNT").arg(1);
        let reply: Value = self.query(&call).await?;
        Ok(entries(&reply).into_iter().next().map(|(id, _)| id))
    }

    async fn range(
        &self,
        stream: &str,
        from_ms: i64,
        to_ms: i64,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let mut call = redis::cmd("XRANGE");
        call.arg(stream)
            .arg(from_ms.max(0))
            .arg(to_ms.max(0))
            .arg("COUNT")
            .arg(count);
        let reply: Value = self.query(&call).await?;
        Ok(entries(&reply))
    }

    async fn first_id(&self, stream: &str) -> Result<Option<String>, StoreError> {
        let mut call = redis::cmd("XRANGE");
        call.arg(stream).arg("-").arg("+").arg("COUNT").arg(1);
        let reply: Value = self.query(&call).await?;
        Ok(entries(&reply).into_iter().next().map(|(id, _)| id))
    }

    /// Acknowledges and deletes entries that are safely in SQL, atomically (`ack.lua`).
    async fn ack(&self, stream: &str, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        // Sent whole (EVAL), like the lease: no script cache to miss.
        let shard = crate::keys::shard_of_tag(crate::keys::hash_tag(stream))
            .ok_or_else(|| StoreError::Protocol(format!("{stream} is no shard's ledger stream")))?;
        let mut ack = redis::cmd("EVAL");
        ack.arg(ACK_LUA)
            .arg(3)
            .arg(stream)
            .arg(crate::keys::deletes_held(&self.prefix, shard))
            .arg(crate::keys::held_entries(&self.prefix, shard))
            .arg(GROUP)
            .arg(ids);
        let _: Value = self.query(&ack).await?;
        Ok(())
    }

    async fn generation(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let Some(shard) = crate::keys::shard_of(stream) else {
            return Ok(None);
        };
        let mut call = redis::cmd("GET");
        call.arg(crate::keys::generation(&self.prefix, shard));
        self.query::<Option<u64>>(&call).await
    }

    fn raise_floors(&self, floors: &[(u16, u64)]) {
        if let Some(known) = &self.floors {
            for &(shard, generation) in floors {
                known.raise(shard, generation);
            }
        }
    }

    async fn move_totals(&self, shard: u16) -> Result<Option<Moving>, StoreError> {
        self.move_shard_totals(shard).await
    }

    async fn moved_totals(&self, shard: u16, content: &str) -> Result<(), StoreError> {
        self.end_shard_move(shard, content).await
    }

    async fn totals_len(&self, shard: u16) -> Result<u64, StoreError> {
        self.shard_totals_len(shard).await
    }

    async fn in_totals(&self, shard: u16, id: &str) -> Result<bool, StoreError> {
        self.shard_totals_hold(shard, id).await
    }
}
