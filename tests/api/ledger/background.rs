//! The ledger's background work on real stores: the group-commit writer and retention.

use super::{entry, everything, ids, label, ledger_on};
use crate::helpers::{eventually, start_instant, PolicyBackend};
use crate::on_policy_stores;
use chrono::Duration;
use quota_ledger::clock::FakeClock;
use quota_ledger::engine::ledger::LedgerFilter;
use quota_ledger::engine::pipeline::writer::LedgerWriter;
use quota_ledger::ledger::retention::Retention;
use std::collections::HashSet;
use std::sync::Arc;

async fn deleting_old_entries_removes_only_those_before_the_cutoff_in_batches(
    backend: PolicyBackend,
) {
    let (store, _database) = ledger_on(backend).await;
    let day = 86_400;
    let mut entries: Vec<_> = (0..5)
        .map(|i| entry(&format!("old-{i}"), "alice", -31 * day - i))
        .collect();
    entries.push(entry("edge", "alice", -30 * day)); // exactly at the cutoff: kept
    entries.push(entry("recent", "alice", -day));
    entries.push(entry("old-late", "bob", -40 * day)); // old, but inserted last
    store.append(&entries).await.unwrap();
    let cutoff = start_instant() - Duration::seconds(30 * day);
    assert_eq!(store.delete_older_than(cutoff, 2).await.unwrap(), 2);
    let left = everything(store.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(
        ids(&left),
        ["recent", "edge", "old-3", "old-2", "old-1", "old-0"],
        "the oldest by time go first, whenever they were inserted"
    );
    let clock = FakeClock::new(start_instant());
    let retention = Retention {
        keep: Duration::days(30),
        batch: 2,
        ..Retention::days(30)
    };
    assert_eq!(retention.sweep(store.as_ref(), &clock).await.unwrap(), 4);
    let left = everything(store.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(ids(&left), ["recent", "edge"]);
    assert_eq!(store.delete_older_than(cutoff, 1000).await.unwrap(), 0);
}

async fn the_retention_task_deletes_old_entries_until_it_is_dropped(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let day = 86_400;
    store
        .append(&[
            entry("old", "alice", -8 * day),
            entry("recent", "alice", -6 * day),
        ])
        .await
        .unwrap();
    let every = std::time::Duration::from_millis(20);
    let retention = Retention {
        first_sweep_after: std::time::Duration::ZERO,
        every,
        pause: std::time::Duration::from_millis(1),
        ..Retention::days(7)
    };
    let clock: Arc<FakeClock> = Arc::new(FakeClock::new(start_instant()));
    let task = retention.spawn(store.clone(), clock, std::sync::Arc::new(|| None));
    let left = eventually(
        std::time::Duration::from_secs(5),
        "the retention task deleting the old entry",
        || async {
            let left = everything(store.as_ref(), &LedgerFilter::default()).await;
            (left.len() == 1).then_some(left)
        },
    )
    .await;
    assert_eq!(ids(&left), ["recent"]);
    drop(task);
    store
        .append(&[entry("old-2", "alice", -9 * day)])
        .await
        .unwrap();
    // Waiting is the point: a task still running would delete old-2 within ten sweeps.
    tokio::time::sleep(10 * every).await;
    let left = everything(store.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(
        ids(&left),
        ["old-2", "recent"],
        "a dropped task deletes nothing more"
    );
}

async fn the_writer_commits_concurrent_appends_exactly_once(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let writer = LedgerWriter::spawn(store.clone());
    let tasks: Vec<_> = (0..40)
        .map(|t| {
            let writer = writer.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    let pair = vec![
                        entry(&format!("t{t}-{i}-a"), "alice", i),
                        entry(&format!("t{t}-{i}-b"), "bob", i),
                    ];
                    writer.append(pair).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stored = everything(store.as_ref(), &LedgerFilter::default()).await;
    let unique: HashSet<String> = ids(&stored).into_iter().collect();
    assert_eq!(stored.len(), 800);
    assert_eq!(unique.len(), 800);
    // A request's entries are committed together, in order.
    for pair in stored.chunks(2) {
        assert_eq!(
            label(&pair[0].id).replace("-b", "-a"),
            label(&pair[1].id),
            "{pair:?}"
        );
    }
}

on_policy_stores!(
    deleting_old_entries_removes_only_those_before_the_cutoff_in_batches,
    the_retention_task_deletes_old_entries_until_it_is_dropped,
    the_writer_commits_concurrent_appends_exactly_once,
);
