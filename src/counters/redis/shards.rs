//! The Redis side of rebuilding shards from the ledger: which shards have no epoch (Redis
//! lost their data, or they were never rebuilt), the lock one instance holds while it
//! rebuilds a shard, and writing the rebuilt state through `script/restore.lua`.

use super::RedisCounterStore;
use crate::engine::shards::{Cut, ShardStates};
use crate::engine::state::{CounterState, StateItem};
use crate::engine::store::StoreError;
use crate::keys::{self, SHARDS};
use async_trait::async_trait;
use redis::{Cmd, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The restore script; its header documents KEYS, ARGV and the reply.
pub(super) const RESTORE_LUA: &str = include_str!("script/restore.lua");

/// One item as the restore script takes it: key, kind, ttl (or score), value.
type Write<'a> = (&'a str, char, i64, String);

/// What the restore script writes for `item` at `now_ms`; `None` when it is gone by then.
fn write_of(item: &StateItem, now_ms: i64) -> Option<Write<'_>> {
    // `expires_at_ms` is the last millisecond the item exists.
    // `i64::MAX` is never (a lifetime counter): restore.lua's ttl 0.
    let ttl = |expires_at_ms: i64| match expires_at_ms {
        i64::MAX => Some(0),
        _ => Some(expires_at_ms - now_ms + 1).filter(|&ttl| ttl > 0),
    };
    match item {
        StateItem::Counter {
            key,
            expires_at_ms,
            state,
        } => {
            let ttl = ttl(*expires_at_ms)?;
            Some(match state {
                CounterState::Calendar { used } => (key, 's', ttl, used.to_string()),
                CounterState::TokenBucket { s, t_ms } => (key, 's', ttl, format!("{s}:{t_ms}")),
                CounterState::Rolling { buckets } => {
                    let mut fields = String::with_capacity(16 * buckets.len());
                    for (i, (index, units)) in buckets.iter().enumerate() {
                        let comma = if i > 0 { "," } else { "" };
                        let _ = write!(fields, "{comma}{index}:{units}");
                    }
                    (key, 'h', ttl, fields)
                }
            })
        }
        StateItem::Record {
            key,
            text,
            expires_at_ms,
        } => Some((key, 's', ttl(*expires_at_ms)?, text.clone())),
        StateItem::IndexedHold {
            index_key,
            hold_id,
            expires_at_ms,
        } => Some((index_key, 'z', *expires_at_ms, hold_id.clone())),
    }
}

impl RedisCounterStore {
    /// Runs one restore call: true when written, false when refused (see the script).
    async fn restore_call(&self, call: &Cmd) -> Result<bool, StoreError> {
        match self.exec(&self.restore, call).await? {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(StoreError::Protocol(format!(
                "restore.lua replied {other:?}"
            ))),
        }
    }

    /// The restore call for `shard`: `writes` (absolute values), the lock extended to
    /// `lock_ttl_ms`, the shard opened if `open`.
    fn restore_cmd(
        &self,
        shard: u16,
        token: &str,
        lock_ttl_ms: u64,
        writes: &[Write<'_>],
        open: bool,
    ) -> Cmd {
        let mut call = Cmd::new();
        call.arg("EVALSHA")
            .arg(self.restore.get_hash())
            .arg(2 + writes.len())
            .arg(keys::rebuild_lock(&self.prefix, shard))
            .arg(keys::epoch(&self.prefix, shard));
        for (key, ..) in writes {
            call.arg(*key);
        }
        call.arg(token).arg(lock_ttl_ms).arg(u8::from(open));
        for (_, kind, ttl, value) in writes {
            call.arg(kind.to_string()).arg(*ttl).arg(value.as_str());
        }
        call
    }
}

#[async_trait]
impl ShardStates for RedisCounterStore {
    async fn closed_shards(&self) -> Result<Vec<u16>, StoreError> {
        if !self.cluster {
            // One command while every shard is open (a cluster takes one key per command).
            let mut exists = redis::cmd("EXISTS");
            for shard in 0..SHARDS {
                exists.arg(keys::epoch(&self.prefix, shard));
            }
            let found: i64 = self.plain(&exists).await?;
            if found == i64::from(SHARDS) {
                return Ok(Vec::new());
            }
        }
        let mut closed = Vec::new();
        for shard in 0..SHARDS {
            let mut exists = redis::cmd("EXISTS");
            exists.arg(keys::epoch(&self.prefix, shard));
            let found: i64 = self.plain(&exists).await?;
            if found == 0 {
                closed.push(shard);
            }
        }
        Ok(closed)
    }

    async fn lock_shard(&self, shard: u16, token: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let mut set = redis::cmd("SET");
        set.arg(keys::rebuild_lock(&self.prefix, shard))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms);
        let reply: Value = self.plain(&set).await?;
        Ok(!matches!(reply, Value::Nil))
    }

    async fn close_shards(&self, shards: &[u16]) -> Result<(), StoreError> {
        for &shard in shards {
            let mut del = redis::cmd("DEL");
            del.arg(keys::epoch(&self.prefix, shard));
            let _: Value = self.plain(&del).await?;
        }
        Ok(())
    }

    async fn write_shard(
        &self,
        shard: u16,
        token: &str,
        lock_ttl_ms: u64,
        now_ms: i64,
        items: &[StateItem],
        open: bool,
    ) -> Result<bool, StoreError> {
        // A few hundred items per call: each call blocks Redis while it runs.
        const PER_CALL: usize = 256;
        // Opened, the shard's write generation is at least its floor: the ledger's state.
        let generation = keys::generation(&self.prefix, shard);
        let mut writes: Vec<Write<'_>> = items.iter().filter_map(|i| write_of(i, now_ms)).collect();
        if open {
            let floor = self.floors.as_ref().map_or(0, |floors| floors.of(shard));
            writes.push((&generation, 'g', 0, floor.to_string()));
        }
        let mut chunks: Vec<&[Write<'_>]> = writes.chunks(PER_CALL).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let call = self.restore_cmd(shard, token, lock_ttl_ms, chunk, open && i == last);
            if !self.restore_call(&call).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn clear_holds_index(
        &self,
        shard: u16,
        token: &str,
        ttl: u64,
    ) -> Result<bool, StoreError> {
        let index = keys::holds_index(&self.prefix, shard);
        let call = self.restore_cmd(shard, token, ttl, &[(&index, 'd', 0, String::new())], false);
        self.restore_call(&call).await
    }

    async fn counter_keys(&self) -> Result<BTreeMap<u16, Vec<String>>, StoreError> {
        self.counter_keys_by_shard().await
    }

    async fn hold_deletes(&self, token: &str, ttl_ms: u64) -> Result<(), StoreError> {
        self.hold_all_deletes(token, ttl_ms).await
    }

    async fn release_deletes(&self, token: &str) -> Result<(), StoreError> {
        self.release_all_deletes(token).await
    }

    async fn read_cut(
        &self,
        token: &str,
        shards: &[u16],
        counters: &[String],
        now_ms: i64,
    ) -> Result<Option<Cut>, StoreError> {
        self.read_instant(token, shards, counters, now_ms).await
    }

    async fn cross_slot_versions(&self, shards: &[u16]) -> Result<Vec<String>, StoreError> {
        self.versions_of(shards).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_values_the_scripts_keep_and_gone_ones_are_left_out() {
        let counter = |state| StateItem::Counter {
            key: "k".to_owned(),
            expires_at_ms: 1_999,
            state,
        };
        let calendar = counter(CounterState::Calendar { used: 7 });
        assert_eq!(
            write_of(&calendar, 1_000),
            Some(("k", 's', 1_000, "7".to_owned()))
        );
        let rolling = counter(CounterState::Rolling {
            buckets: vec![(-1, 2), (5, 3)],
        });
        assert_eq!(
            write_of(&rolling, 1_000).map(|w| w.3),
            Some("-1:2,5:3".to_owned())
        );
        let gcra = counter(CounterState::TokenBucket { s: 40, t_ms: 900 });
        assert_eq!(
            write_of(&gcra, 1_000).map(|w| w.3),
            Some("40:900".to_owned())
        );
        assert_eq!(
            write_of(&calendar, 2_000),
            None,
            "gone after its last millisecond"
        );
        let hold = StateItem::IndexedHold {
            index_key: "i".to_owned(),
            hold_id: "h".to_owned(),
            expires_at_ms: 5,
        };
        assert_eq!(write_of(&hold, 1_000), Some(("i", 'z', 5, "h".to_owned())));
    }
}
