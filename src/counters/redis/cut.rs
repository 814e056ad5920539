//! The Redis side of `counters verify` (`engine::cut`): which counters Redis holds, holding
//! back deletions from the ledger streams while a verify reads, and reading some shards'
//! streams and counters at one instant through `script/cut.lua`.

use super::call::bounded;
use super::{Connection, RedisCounterStore};
use crate::engine::shards::Cut;
use crate::engine::state::{CounterState, StateItem};
use crate::engine::store::StoreError;
use crate::keys::{self, SHARDS};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Reads one instant of some shards; its header documents KEYS, ARGV and the reply.
const CUT_LUA: &str = include_str!("script/cut.lua");

/// Lets deletions go on again and deletes what was held, if still the caller's hold.
const UNHOLD_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ids = redis.call('LRANGE', KEYS[3], 0, -1)
for i = 1, #ids, 1000 do
  redis.call('XDEL', KEYS[2], unpack(ids, i, math.min(i + 999, #ids)))
end
redis.call('DEL', KEYS[3])
return #ids
";

/// A verify's calls read many keys: they get this long, not the per-decision timeout.
const SLOW_CALL: Duration = Duration::from_secs(10);

/// Keys listed per `SCAN` step.
const SCAN_COUNT: u32 = 1_000;

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// `pattern` with Redis's glob characters escaped.
fn glob_escaped(pattern: &str) -> String {
    let mut escaped = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The state a counter's stored value stands for, read at `now_ms` with `pttl` ms to live:
/// a calendar period's units (`"7"`), a token bucket (`"s:t"`), a zoned calendar period
/// kept as a record (`"used:start:end"`), or a rolling window's hash of buckets.
fn item_of(key: String, kind: &str, value: &Value, pttl: i64, now_ms: i64) -> Option<StateItem> {
    let expires_at_ms = match pttl {
        ms if ms >= 0 => now_ms + ms - 1,
        _ => i64::MAX,
    };
    let state = match kind {
        "s" => {
            let text = text(value)?;
            let parts: Vec<&str> = text.split(':').collect();
            match parts.as_slice() {
                [used] => CounterState::Calendar {
                    used: used.parse().ok()?,
                },
                [s, t_ms] => CounterState::TokenBucket {
                    s: s.parse().ok()?,
                    t_ms: t_ms.parse().ok()?,
                },
                _ => {
                    return Some(StateItem::Record {
                        key,
                        text,
                        expires_at_ms,
                    })
                }
            }
        }
        "h" => {
            let Value::Array(fields) = value else {
                return None;
            };
            let mut buckets: Vec<(i64, u64)> = fields
                .chunks(2)
                .filter_map(|kv| Some((int(kv.first()?)?, u64::try_from(int(kv.get(1)?)?).ok()?)))
                .collect();
            buckets.sort_unstable();
            CounterState::Rolling { buckets }
        }
        _ => return None,
    };
    Some(StateItem::Counter {
        key,
        expires_at_ms,
        state,
    })
}

impl RedisCounterStore {
    /// Runs `call` on the node of `key`'s slot (any command, on a cluster too), within
    /// [`SLOW_CALL`], on a connection of its own.
    async fn on_node_of(&self, key: &str, call: Cmd) -> Result<Value, StoreError> {
        match self.slow_connection(SLOW_CALL).await? {
            Connection::Standalone(mut c, _) => bounded(SLOW_CALL, call.query_async(&mut c)).await,
            Connection::Cluster(mut c, _) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                bounded(SLOW_CALL, c.route_command(call, routing)).await
            }
        }
    }

    /// Every counter key Redis holds, by shard: one `SCAN` of the keyspace on a standalone
    /// Redis, `CLUSTER GETKEYSINSLOT` per shard on a cluster.
    pub(super) async fn counter_keys_by_shard(
        &self,
    ) -> Result<BTreeMap<u16, Vec<String>>, StoreError> {
        let mut found: Vec<String> = Vec::new();
        if self.cluster {
            for shard in 0..SHARDS {
                let stream = keys::ledger_stream(&self.prefix, shard);
                let mut slot = redis::cmd("CLUSTER");
                slot.arg("KEYSLOT").arg(&stream);
                let slot = int(&self.on_node_of(&stream, slot).await?).unwrap_or(0);
                let mut list = redis::cmd("CLUSTER");
                list.arg("GETKEYSINSLOT").arg(slot).arg(u32::MAX / 2);
                if let Value::Array(listed) = self.on_node_of(&stream, list).await? {
                    found.extend(listed.iter().filter_map(text));
                }
            }
        } else {
            let pattern = format!("{}{{*", glob_escaped(&self.prefix));
            let mut cursor = String::from("0");
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(&cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let reply = self.on_node_of(&pattern, scan).await?;
                let Value::Array(parts) = reply else {
                    return Err(StoreError::Protocol(format!("SCAN replied {reply:?}")));
                };
                cursor = parts.first().and_then(text).unwrap_or_default();
                if let Some(Value::Array(listed)) = parts.get(1) {
                    found.extend(listed.iter().filter_map(text));
                }
                if cursor == "0" || cursor.is_empty() {
                    break;
                }
            }
        }
        let mut by_shard: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        for key in found {
            if !key.starts_with(&self.prefix) || keys::counter_policy_key(&key).is_none() {
                continue;
            }
            if let Some(shard) = keys::shard_of_tag(keys::hash_tag(&key)) {
                by_shard.entry(shard).or_default().push(key);
            }
        }
        Ok(by_shard)
    }

    /// Holds deletions from every shard's stream for `ttl_ms`, as `token`.
    pub(super) async fn hold_all_deletes(
        &self,
        token: &str,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        for shard in 0..SHARDS {
            let mut set = redis::cmd("SET");
            set.arg(keys::deletes_held(&self.prefix, shard))
                .arg(token)
                .arg("PX")
                .arg(ttl_ms);
            let _: Value = self.plain(&set).await?;
        }
        Ok(())
    }

    /// Lets every shard's deletions go on (those `token` holds) and deletes what was held.
    pub(super) async fn release_all_deletes(&self, token: &str) -> Result<(), StoreError> {
        for shard in 0..SHARDS {
            let held = keys::deletes_held(&self.prefix, shard);
            let mut call = redis::cmd("EVAL");
            call.arg(UNHOLD_LUA)
                .arg(3)
                .arg(&held)
                .arg(keys::ledger_stream(&self.prefix, shard))
                .arg(keys::held_entries(&self.prefix, shard))
                .arg(token);
            self.on_node_of(&held, call).await?;
        }
        Ok(())
    }

    /// Each shard's version of steps across slots and epoch (`keys::cross_slot_version`),
    /// as one text per shard.
    pub(super) async fn versions_of(&self, shards: &[u16]) -> Result<Vec<String>, StoreError> {
        let mut versions = Vec::with_capacity(shards.len());
        for &shard in shards {
            let version = keys::cross_slot_version(&self.prefix, shard);
            let mut get = redis::cmd("MGET");
            get.arg(&version).arg(keys::epoch(&self.prefix, shard));
            let reply = self.on_node_of(&version, get).await?;
            let Value::Array(parts) = reply else {
                return Err(StoreError::Protocol(format!("MGET replied {reply:?}")));
            };
            let part = |i: usize| parts.get(i).and_then(text).unwrap_or_default();
            versions.push(format!("{}:{}", part(0), part(1)));
        }
        Ok(versions)
    }

    /// The entries of `shards`' streams and the states of `counters`, at one instant; `None`
    /// when `token` no longer holds those streams' deletions.
    pub(super) async fn read_instant(
        &self,
        token: &str,
        shards: &[u16],
        counters: &[String],
        now_ms: i64,
    ) -> Result<Option<Cut>, StoreError> {
        let Some(&first) = shards.first() else {
            return Ok(Some(Cut::default()));
        };
        let streams: Vec<String> = shards
            .iter()
            .map(|&s| keys::ledger_stream(&self.prefix, s))
            .collect();
        let mut call = redis::cmd("EVAL");
        call.arg(CUT_LUA).arg(5 * shards.len() + counters.len());
        call.arg(&streams);
        for &shard in shards {
            call.arg(keys::deletes_held(&self.prefix, shard));
        }
        for &shard in shards {
            call.arg(keys::intents_index(&self.prefix, shard));
        }
        for &shard in shards {
            call.arg(keys::totals_waiting(&self.prefix, shard));
        }
        for &shard in shards {
            call.arg(keys::totals_moving(&self.prefix, shard));
        }
        call.arg(counters).arg(token).arg(shards.len());
        let reply = self
            .on_node_of(&keys::ledger_stream(&self.prefix, first), call)
            .await?;
        let Value::Array(parts) = reply else {
            return Ok(None);
        };
        let mut cut = Cut::default();
        for part in parts.iter().take(shards.len()) {
            cut.entries.extend(super::stream::entries(part));
        }
        for part in parts.iter().skip(shards.len()).take(shards.len()) {
            if let Value::Array(records) = part {
                cut.intents.extend(records.iter().filter_map(text));
            }
        }
        for part in parts.iter().skip(2 * shards.len()).take(2 * shards.len()) {
            let Value::Array(fields) = part else {
                continue;
            };
            let hash: Vec<(String, String)> = fields
                .chunks(2)
                .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
                .collect();
            if !hash.is_empty() {
                cut.totals.push(hash);
            }
        }
        for (key, part) in counters.iter().zip(parts.iter().skip(4 * shards.len())) {
            let Value::Array(fields) = part else {
                continue;
            };
            let (Some(kind), Some(value), Some(pttl)) = (
                fields.first().and_then(text),
                fields.get(1),
                fields.get(2).and_then(int),
            ) else {
                continue;
            };
            cut.items
                .extend(item_of(key.clone(), &kind, value, pttl, now_ms));
        }
        Ok(Some(cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn stored_values_read_back_as_the_states_they_stand_for() {
        let calendar = item_of("k".into(), "s", &bulk("7"), 1_000, 5_000);
        assert_eq!(
            calendar,
            Some(StateItem::Counter {
                key: "k".into(),
                expires_at_ms: 5_999,
                state: CounterState::Calendar { used: 7 }
            })
        );
        let bucket = item_of("k".into(), "s", &bulk("40:900"), -1, 0);
        assert!(matches!(
            bucket,
            Some(StateItem::Counter {
                state: CounterState::TokenBucket { s: 40, t_ms: 900 },
                ..
            })
        ));
        let zoned = item_of("k".into(), "s", &bulk("3:10:20"), 5, 0);
        assert!(matches!(zoned, Some(StateItem::Record { text, .. }) if text == "3:10:20"));
        let rolling = Value::Array(vec![bulk("5"), bulk("3"), bulk("-1"), bulk("2")]);
        let rolling = item_of("k".into(), "h", &rolling, 5, 0);
        assert!(matches!(rolling, Some(StateItem::Counter {
            state: CounterState::Rolling { buckets }, ..
        }) if buckets == vec![(-1, 2), (5, 3)]));
        assert_eq!(item_of("k".into(), "n", &bulk(""), -2, 0), None);
    }

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
