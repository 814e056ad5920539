//! Redis Cluster only: where keys live, and decisions that stay exact while a slot moves.
//!
//! Every key of one decision shares one hash tag, so one slot and one primary; different
//! subjects (tags) spread over all primaries. While a slot is being migrated the source
//! answers ASK for keys it no longer has, and once the slot has moved every stale client gets
//! MOVED: the store must follow both and keep counting on the same counters.

use std::collections::{BTreeMap, BTreeSet};

use redis::aio::MultiplexedConnection;
use redis::{from_redis_value_ref, Value};

use super::{
    calendar, charge, cluster_store, cluster_urls, rolling, token_bucket, unique_tag, DAY, T0,
};
use crate::engine::store::{Charge, CounterStore};

/// Slot ranges, first and last slot included.
type SlotRanges = Vec<(i64, i64)>;

/// One primary of the test cluster, reached directly (not through cluster routing).
struct Primary {
    /// `host:port`, as the cluster announces it.
    host: String,
    /// The port, for MIGRATE.
    port: u16,
    /// The node id, for CLUSTER SETSLOT.
    id: String,
    /// The slot ranges it serves.
    slots: SlotRanges,
    /// A plain connection to it.
    connection: MultiplexedConnection,
}

impl Primary {
    /// Sends `command` to this node alone.
    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        command
            .query_async(&mut self.connection.clone())
            .await
            .unwrap_or_else(|e| panic!("{command:?} on {}:{}: {e}", self.host, self.port))
    }

    /// How many `code` error replies (ASK, MOVED) this node has sent (INFO errorstats).
    async fn errors_sent(&self, code: &str) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("errorstats")).await;
        let prefix = format!("errorstat_{code}:count=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }
}

/// The cluster's primaries and their slots, read with CLUSTER SLOTS.
struct Topology {
    primaries: Vec<Primary>,
}

impl Topology {
    async fn read() -> Self {
        let first = plain_connection(&cluster_urls()[0]).await;
        let ranges: Vec<Vec<Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut first.clone())
            .await
            .expect("CLUSTER SLOTS");
        // Primaries by id: where they listen and the slot ranges they serve.
        let mut by_id: BTreeMap<String, ((String, u16), SlotRanges)> = BTreeMap::new();
        for range in &ranges {
            let number = |i: usize| from_redis_value_ref::<i64>(&range[i]).expect("a slot number");
            let master: Vec<Value> = from_redis_value_ref(&range[2]).expect("the primary");
            let host: String = from_redis_value_ref(&master[0]).expect("its host");
            let port: u16 = from_redis_value_ref(&master[1]).expect("its port");
            let id: String = from_redis_value_ref(&master[2]).expect("its id");
            let entry = by_id.entry(id).or_insert(((host, port), Vec::new()));
            entry.1.push((number(0), number(1)));
        }
        let mut primaries = Vec::new();
        for (id, ((host, port), slots)) in by_id {
            let connection = plain_connection(&format!("redis://{host}:{port}/")).await;
            primaries.push(Primary {
                host,
                port,
                id,
                slots,
                connection,
            });
        }
        assert!(
            primaries.len() >= 2,
            "the test cluster needs at least two primaries, found {}",
            primaries.len()
        );
        Self { primaries }
    }

    /// The slot of `key` (CLUSTER KEYSLOT).
    async fn slot_of(&self, key: &str) -> i64 {
        self.primaries[0]
            .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .await
    }

    /// The index of the primary serving `slot`.
    fn owner(&self, slot: i64) -> usize {
        self.primaries
            .iter()
            .position(|p| p.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }
}

async fn plain_connection(url: &str) -> MultiplexedConnection {
    let mut connection = redis::Client::open(url)
        .expect("a valid node URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connecting to cluster node {url}: {e}"));
    // The crate's default of 500 ms is too short for a slot migration's commands while the
    // whole suite runs on two cores.
    connection.set_response_timeout(std::time::Duration::from_secs(10));
    connection
}

/// The three counters of one subject (hash tag `tag`), as one decision would charge them.
fn decision(tag: &str) -> [Charge; 3] {
    let key = |name: &str| format!("ql-test:{{{tag}}}:{name}");
    [
        charge(&key("day"), calendar(T0 + DAY), 10, 1),
        charge(&key("roll"), rolling(1_000, 10), 10, 1),
        charge(&key("tok"), token_bucket(10_000), 10, 1),
    ]
}

#[tokio::test]
async fn different_subjects_spread_over_every_primary_and_one_subjects_keys_stay_together() {
    let topology = Topology::read().await;
    let store = cluster_store().await;
    let run = unique_tag("spread");
    // Subjects until every primary serves some (a few dozen at most with 3 primaries).
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..1_000 {
        let served: BTreeSet<usize> = owners.values().copied().collect();
        if served.len() == topology.primaries.len() && owners.len() >= 12 {
            break;
        }
        let tag = format!("{run}|subject-{i}");
        let slot = topology.slot_of(decision(&tag)[0].key.as_str()).await;
        owners.insert(tag, topology.owner(slot));
    }
    for tag in owners.keys() {
        let evaluation = store
            .evaluate(T0, &decision(tag), true)
            .await
            .expect("charges");
        assert!(evaluation.allowed, "{tag}: {evaluation:?}");
    }

    let pattern = format!("ql-test:{{{run}|subject-*");
    let mut nodes_with_keys = 0;
    for (index, primary) in topology.primaries.iter().enumerate() {
        let found: BTreeSet<String> = primary.query(redis::cmd("KEYS").arg(&pattern)).await;
        let expected: BTreeSet<String> = owners
            .iter()
            .filter(|(_, owner)| **owner == index)
            .flat_map(|(tag, _)| decision(tag).map(|c| c.key.as_str().to_owned()))
            .collect();
        assert_eq!(found, expected, "keys on {}:{}", primary.host, primary.port);
        nodes_with_keys += usize::from(!found.is_empty());
        let dbsize: usize = primary.query(&redis::cmd("DBSIZE")).await;
        assert!(dbsize >= found.len());
    }
    assert_eq!(nodes_with_keys, topology.primaries.len());

    for (tag, owner) in &owners {
        let keys: Vec<String> = decision(tag).map(|c| c.key.as_str().to_owned()).into();
        let _: i64 = topology.primaries[*owner]
            .query(redis::cmd("DEL").arg(&keys))
            .await;
    }
}

#[tokio::test]
async fn the_store_follows_ask_and_moved_while_a_subjects_slot_moves_to_another_primary() {
    let topology = Topology::read().await;
    let store = cluster_store().await;
    // A subject whose slot holds no other key, so that moving it disturbs no other test.
    let mut found = None;
    for _ in 0..100 {
        let tag = unique_tag("moving");
        let slot = topology.slot_of(decision(&tag)[0].key.as_str()).await;
        let source = topology.owner(slot);
        let keys: i64 = topology.primaries[source]
            .query(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))
            .await;
        if keys == 0 {
            found = Some((tag, slot, source));
            break;
        }
    }
    let (tag, slot, source) = found.expect("an empty slot");
    let charges = decision(&tag);
    let used = |e: &crate::engine::store::Evaluation| -> Vec<u64> {
        e.outcomes.iter().map(|o| o.used).collect()
    };
    let first = store.evaluate(T0, &charges, true).await.expect("charges");
    assert_eq!(used(&first), [1, 1, 1]);

    let (from, to) = (
        &topology.primaries[source],
        &topology.primaries[(source + 1) % topology.primaries.len()],
    );
    let setslot = |state: &str, node: &str| {
        let mut command = redis::cmd("CLUSTER");
        command.arg("SETSLOT").arg(slot).arg(state).arg(node);
        command
    };
    let _: () = to.query(&setslot("IMPORTING", &from.id)).await;
    let _: () = from.query(&setslot("MIGRATING", &to.id)).await;
    let keys: Vec<String> = from
        .query(
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100),
        )
        .await;
    assert_eq!(keys.len(), 3, "{keys:?}");
    let _: () = from
        .query(
            redis::cmd("MIGRATE")
                .arg(&to.host)
                .arg(to.port)
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg("KEYS")
                .arg(&keys),
        )
        .await;

    // The slot is still the source's, but the keys are gone from it: it answers ASK.
    let asks = from.errors_sent("ASK").await;
    let during = store.evaluate(T0 + 1, &charges, true).await.expect("ASK");
    assert_eq!(used(&during), [2, 2, 2], "the same counters, on the target");
    assert!(
        from.errors_sent("ASK").await > asks,
        "the source answered ASK"
    );

    // The slot now belongs to the target; the store's slot map is stale: MOVED.
    for node in [to, from].into_iter().chain(
        topology
            .primaries
            .iter()
            .filter(|p| p.id != to.id && p.id != from.id),
    ) {
        let _: () = node.query(&setslot("NODE", &to.id)).await;
    }
    let moves = from.errors_sent("MOVED").await;
    let after = store.evaluate(T0 + 2, &charges, true).await.expect("MOVED");
    assert_eq!(used(&after), [3, 3, 3]);
    assert!(
        from.errors_sent("MOVED").await > moves,
        "the source answered MOVED"
    );
    let on_target: usize = to.query(redis::cmd("EXISTS").arg(&keys)).await;
    assert_eq!(on_target, 3);
    let _: i64 = to.query(redis::cmd("DEL").arg(&keys)).await;
}
