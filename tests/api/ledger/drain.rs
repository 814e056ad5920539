//! The Redis-stream drain against a real Redis and a real SQL ledger.

use super::{entry, everything, ledger_at, ledger_on};
use crate::helpers::{fresh_settings, CounterBackend, PolicyBackend};
use crate::on_policy_stores;
use quota_ledger::engine::keys::{ledger_stream, SHARDS};
use quota_ledger::engine::store::redis::RedisCounterStore;
use quota_ledger::engine::DrainNow;
use quota_ledger::ledger::drain::Drainer;
use quota_ledger::ledger::LedgerFilter;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// More entries than one transaction takes (5,000), spread over every shard's stream: one
/// pass moves each into SQL exactly once, in several transactions, and empties the streams.
async fn a_pass_moves_every_shards_entries_across_several_transactions(backend: PolicyBackend) {
    let settings = fresh_settings(backend, CounterBackend::Redis).await;
    let ledger = ledger_on(backend).await;
    let redis = Arc::new(
        RedisCounterStore::connect(&settings.redis_urls, false, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let drainer = Drainer::new(
        redis,
        ledger.clone(),
        settings.redis_prefix.clone(),
        Duration::from_secs(30),
    );
    // As at startup: the first pass creates each stream's consumer group.
    assert_eq!(drainer.drain_once().await, 0);

    let total = 6_100;
    let client = redis::Client::open(settings.redis_urls[0].as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..total {
        let shard = u16::try_from(i % usize::from(SHARDS)).unwrap();
        let stream = ledger_stream(&settings.redis_prefix, shard);
        let text = serde_json::to_string(&entry(&format!("e{i}"), &format!("s{i}"), 0)).unwrap();
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("e")
            .arg(text)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();

    assert_eq!(drainer.drain_once().await, total);
    let stored = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    let unique: HashSet<&str> = stored.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(stored.len(), total);
    assert_eq!(unique.len(), total);
    assert_eq!(
        drainer.backlog().await,
        Some(0),
        "drained entries are deleted"
    );
    assert_eq!(drainer.drain_once().await, 0, "nothing is moved twice");
}

/// Runs `sql` on the database at `url`.
async fn execute(url: &str, sql: &str) {
    match quota_ledger::db::open(url, 1).await.unwrap() {
        quota_ledger::db::Pool::Postgres(pool) => {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        quota_ledger::db::Pool::Sqlite(pool) => {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
    }
}

/// A pass whose insert fails leaves what it read pending; the next pass rereads all of it
/// (here 1,200 entries on one shard, more than one read's 500) and moves it exactly once.
async fn entries_of_a_failed_pass_are_all_moved_by_the_next(backend: PolicyBackend) {
    let settings = fresh_settings(backend, CounterBackend::Redis).await;
    let ledger = ledger_at(&settings.database_url).await;
    let redis = Arc::new(
        RedisCounterStore::connect(&settings.redis_urls, false, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let drainer = Drainer::new(
        redis,
        ledger.clone(),
        settings.redis_prefix.clone(),
        Duration::from_secs(30),
    );
    assert_eq!(drainer.drain_once().await, 0);
    let total = 1_200;
    let client = redis::Client::open(settings.redis_urls[0].as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    let stream = ledger_stream(&settings.redis_prefix, 7);
    for i in 0..total {
        let text = serde_json::to_string(&entry(&format!("e{i}"), "alice", 0)).unwrap();
        pipe.cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("e")
            .arg(text)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();

    // The insert fails: the table is gone for a moment.
    execute(
        &settings.database_url,
        "ALTER TABLE ledger_entries RENAME TO ledger_away",
    )
    .await;
    assert_eq!(drainer.drain_once().await, 0);
    execute(
        &settings.database_url,
        "ALTER TABLE ledger_away RENAME TO ledger_entries",
    )
    .await;
    assert_eq!(drainer.backlog().await, Some(total as u64));

    assert_eq!(drainer.drain_once().await, total);
    let stored = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(stored.len(), total);
    assert_eq!(drainer.backlog().await, Some(0));
}

/// An entry the database refuses (here an action of 65 characters, past the table's
/// CHECK) stays pending in Redis; every other entry of its transaction is moved.
async fn an_entry_the_database_refuses_holds_back_no_other(backend: PolicyBackend) {
    let settings = fresh_settings(backend, CounterBackend::Redis).await;
    let ledger = ledger_at(&settings.database_url).await;
    let redis = Arc::new(
        RedisCounterStore::connect(&settings.redis_urls, false, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let drainer = Drainer::new(
        redis,
        ledger.clone(),
        settings.redis_prefix.clone(),
        Duration::from_secs(30),
    );
    assert_eq!(drainer.drain_once().await, 0);
    let client = redis::Client::open(settings.redis_urls[0].as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..30 {
        let mut e = entry(&format!("e{i}"), "alice", 0);
        if i == 17 {
            e.action = "a".repeat(65);
        }
        let stream = ledger_stream(&settings.redis_prefix, (i % 3) as u16);
        let text = serde_json::to_string(&e).unwrap();
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("e")
            .arg(text)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();

    assert_eq!(drainer.drain_once().await, 29);
    let stored = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    let ids: HashSet<&str> = stored.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 29);
    assert!(!ids.contains("e17"));
    assert_eq!(
        drainer.backlog().await,
        Some(1),
        "the refused entry is kept"
    );
}

on_policy_stores!(
    a_pass_moves_every_shards_entries_across_several_transactions,
    entries_of_a_failed_pass_are_all_moved_by_the_next,
    an_entry_the_database_refuses_holds_back_no_other,
);
