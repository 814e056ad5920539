//! The Redis-stream drain against a real Redis and a real SQL ledger.

use super::{entry, everything, label, ledger_at};
use crate::helpers::{fresh_settings, CounterBackend, FreshSettings, PolicyBackend};
use crate::on_policy_stores;
use quota_ledger::counters::redis::RedisCounterStore;
use quota_ledger::domain::LedgerEntry;
use quota_ledger::engine::ledger::{LedgerFilter, LedgerStore};
use quota_ledger::engine::pipeline::drain::Drainer;
use quota_ledger::keys::{ledger_stream, SHARDS};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// A fresh database (deleted with the setup, on SQLite) and Redis prefix, the ledger on that
/// database, and a drain over it that has made its first pass (which, as at startup,
/// creates the consumer groups).
struct Setup {
    settings: FreshSettings,
    ledger: Arc<dyn LedgerStore>,
    drainer: Drainer,
}

async fn setup(backend: PolicyBackend) -> Setup {
    let settings = fresh_settings(backend, CounterBackend::Redis).await;
    let ledger = ledger_at(&settings.database_url).await;
    let redis = RedisCounterStore::connect(&settings.redis_urls, false, Duration::from_secs(5))
        .await
        .unwrap();
    let drainer = Drainer::new(
        Arc::new(redis),
        ledger.clone(),
        settings.redis_prefix.clone(),
        Duration::from_secs(30),
    );
    assert_eq!(drainer.drain_once().await, 0);
    Setup {
        settings,
        ledger,
        drainer,
    }
}

impl Setup {
    /// Appends each entry to its shard's stream, as the consume script does.
    async fn append(&self, entries: impl IntoIterator<Item = (u16, LedgerEntry)>) {
        let client = redis::Client::open(self.settings.redis_urls[0].as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut pipe = redis::pipe();
        for (shard, entry) in entries {
            pipe.cmd("XADD")
                .arg(ledger_stream(&self.settings.redis_prefix, shard))
                .arg("*")
                .arg("e")
                .arg(quota_ledger::engine::codec::encode_entry(&entry))
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }

    /// Runs `sql` on the ledger's database.
    async fn execute(&self, sql: &str) {
        match quota_ledger::db::open(&self.settings.database_url, 1)
            .await
            .unwrap()
        {
            quota_ledger::db::Pool::Postgres(pool) => {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
            quota_ledger::db::Pool::Sqlite(pool) => {
                sqlx::query(sql).execute(&pool).await.unwrap();
            }
        }
    }

    async fn stored_ids(&self) -> HashSet<String> {
        everything(self.ledger.as_ref(), &LedgerFilter::default())
            .await
            .into_iter()
            .map(|e| label(&e.id))
            .collect()
    }
}

/// More entries than one transaction takes (5,000), spread over every shard's stream: one
/// pass moves each into SQL exactly once, in several transactions, and empties the streams.
async fn a_pass_moves_every_shards_entries_across_several_transactions(backend: PolicyBackend) {
    let s = setup(backend).await;
    let total = 6_100;
    s.append((0..total).map(|i| {
        let shard = u16::try_from(i % usize::from(SHARDS)).unwrap();
        (shard, entry(&format!("e{i}"), &format!("s{i}"), 0))
    }))
    .await;

    assert_eq!(s.drainer.drain_once().await, total);
    let stored = everything(s.ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(stored.len(), total);
    assert_eq!(s.stored_ids().await.len(), total);
    assert_eq!(
        s.drainer.backlog().await,
        Some(0),
        "drained entries are deleted"
    );
    assert_eq!(s.drainer.drain_once().await, 0, "nothing is moved twice");
}

/// A pass whose insert fails leaves what it read pending; the next pass rereads all of it
/// (here 1,200 entries on one shard, more than one read's 500) and moves it exactly once.
async fn entries_of_a_failed_pass_are_all_moved_by_the_next(backend: PolicyBackend) {
    let s = setup(backend).await;
    let total = 1_200;
    s.append((0..total).map(|i| (7, entry(&format!("e{i}"), "alice", 0))))
        .await;

    // The insert fails: the table is gone for a moment.
    s.execute("ALTER TABLE ledger_entries RENAME TO ledger_away")
        .await;
    assert_eq!(s.drainer.drain_once().await, 0);
    s.execute("ALTER TABLE ledger_away RENAME TO ledger_entries")
        .await;
    assert_eq!(s.drainer.backlog().await, Some(total as u64));

    assert_eq!(s.drainer.drain_once().await, total);
    let stored = everything(s.ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(stored.len(), total);
    assert_eq!(s.drainer.backlog().await, Some(0));
}

/// An entry the database refuses (here an amount of 2^53, past the table's CHECK) stays
/// pending in Redis; every other entry of its transaction is moved.
async fn an_entry_the_database_refuses_holds_back_no_other(backend: PolicyBackend) {
    let s = setup(backend).await;
    s.append((0..30_u16).map(|i| {
        let mut e = entry(&format!("e{i}"), "alice", 0);
        if i == 17 {
            e.amount = 1 << 53;
        }
        (i % 3, e)
    }))
    .await;

    assert_eq!(s.drainer.drain_once().await, 29);
    let ids = s.stored_ids().await;
    assert_eq!(ids.len(), 29);
    assert!(!ids.contains("e17"));
    assert_eq!(
        s.drainer.backlog().await,
        Some(1),
        "the refused entry is kept"
    );
}

on_policy_stores!(
    a_pass_moves_every_shards_entries_across_several_transactions,
    entries_of_a_failed_pass_are_all_moved_by_the_next,
    an_entry_the_database_refuses_holds_back_no_other,
);
