//! Reading Redis's `INFO memory`: the memory in use, its bound and the eviction policy of
//! every node (for `/metrics`, and the refusal of an evicting policy).

use crate::engine::store::StoreMemory;
use redis::Value;

/// What every node's `INFO memory` says (sums over the nodes of a cluster).
pub(super) fn store_memory(reply: &Value) -> StoreMemory {
    let numbers = |name: &str| -> Vec<u64> {
        info_fields(reply, name)
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let max = numbers("maxmemory");
    let mut policies = eviction_policies(reply);
    policies.sort();
    policies.dedup();
    StoreMemory {
        used_bytes: numbers("used_memory").iter().sum(),
        max_bytes: match max.contains(&0) {
            true => 0,
            false => max.iter().sum(),
        },
        policies,
    }
}

/// The `maxmemory_policy` of every node in an `INFO memory` reply (one text, or one per
/// node in Redis Cluster).
pub(super) fn eviction_policies(reply: &Value) -> Vec<String> {
    info_fields(reply, "maxmemory_policy")
}

/// The fewest replicas online (`slaveN:…,state=online,…`) of the primaries whose
/// `INFO replication` texts `reply` holds (one, or one per primary in Redis Cluster); 0
/// when it holds none.
pub(super) fn fewest_online_replicas(reply: &Value) -> usize {
    node_texts(reply)
        .iter()
        .map(|text| {
            text.lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .count()
        })
        .min()
        .unwrap_or(0)
}

/// The values of the field `name` in every node's `INFO` text of `reply`.
fn info_fields(reply: &Value, name: &str) -> Vec<String> {
    node_texts(reply)
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(|line| {
            let (field, value) = line.trim().split_once(':')?;
            (field == name).then(|| value.to_owned())
        })
        .collect()
}

/// Every node's `INFO` text in `reply`.
fn node_texts(reply: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    let mut pending = vec![reply];
    while let Some(value) = pending.pop() {
        match value {
            Value::BulkString(bytes) => texts.push(String::from_utf8_lossy(bytes).into_owned()),
            Value::SimpleString(text) => texts.push(text.clone()),
            Value::VerbatimString { text, .. } => texts.push(text.clone()),
            Value::Array(items) | Value::Set(items) => pending.extend(items),
            Value::Map(pairs) => pending.extend(pairs.iter().map(|(_, v)| v)),
            _ => {}
        }
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_online_replicas_of_the_primaries_are_read_from_info() {
        let node =
            |lines: &str| Value::BulkString(format!("# Replication\r\n{lines}").into_bytes());
        let two = node("connected_slaves:2\r\nslave0:ip=a,port=1,state=online,offset=1\r\nslave1:ip=b,port=2,state=online,offset=1\r\n");
        let syncing =
            node("connected_slaves:1\r\nslave0:ip=a,port=1,state=wait_bgsave,offset=0\r\n");
        assert_eq!(fewest_online_replicas(&two), 2);
        assert_eq!(
            fewest_online_replicas(&syncing),
            0,
            "a syncing replica is not online"
        );
        let cluster = Value::Map(vec![
            (Value::SimpleString("n1".into()), two),
            (
                Value::SimpleString("n2".into()),
                node("slave0:ip=c,port=3,state=online,offset=5\r\n"),
            ),
        ]);
        assert_eq!(
            fewest_online_replicas(&cluster),
            1,
            "the primary with the fewest"
        );
    }

    #[test]
    fn the_eviction_policy_of_every_node_is_read_from_info() {
        let info = |policy: &str| {
            Value::BulkString(
                format!("# Memory\r\nused_memory:1\r\nmaxmemory_policy:{policy}\r\n").into_bytes(),
            )
        };
        assert_eq!(eviction_policies(&info("noeviction")), ["noeviction"]);
        let cluster = Value::Map(vec![
            (Value::SimpleString("a:1".into()), info("noeviction")),
            (Value::SimpleString("b:2".into()), info("volatile-lru")),
        ]);
        let mut policies = eviction_policies(&cluster);
        policies.sort();
        assert_eq!(policies, ["noeviction", "volatile-lru"]);
        assert!(eviction_policies(&Value::Nil).is_empty());
        let memory = |used: u64, max: u64, policy: &str| {
            format!("# Memory\r\nused_memory:{used}\r\nused_memory_human:1K\r\nmaxmemory:{max}\r\nmaxmemory_human:0B\r\nmaxmemory_policy:{policy}\r\n")
        };
        let two = Value::Map(vec![
            (
                Value::SimpleString("a:1".into()),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: memory(100, 1_000, "noeviction"),
                },
            ),
            (
                Value::SimpleString("b:2".into()),
                Value::BulkString(memory(50, 2_000, "allkeys-lru").into_bytes()),
            ),
        ]);
        assert_eq!(
            store_memory(&two),
            StoreMemory {
                used_bytes: 150,
                max_bytes: 3_000,
                policies: vec!["allkeys-lru".to_owned(), "noeviction".to_owned()],
            }
        );
        let unbounded = Value::BulkString(memory(7, 0, "noeviction").into_bytes());
        assert_eq!(store_memory(&unbounded).max_bytes, 0);
    }
}
