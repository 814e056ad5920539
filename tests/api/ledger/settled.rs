//! `LedgerStore::settled_seq`: the `seq` up to which every entry is committed, or never
//! will be, although appends run several at a time and may commit out of `seq` order.

use super::{entry, ledger_on};
use crate::helpers::PolicyBackend;
use quota_ledger::domain::Action;
use std::time::Duration;

/// An append that took its `seq`s and has not committed yet (its rollup row is locked by
/// another session) holds the settled `seq` back, although a later append committed a
/// higher one: a reader that took the highest committed `seq` as settled would skip it.
#[tokio::test]
async fn an_append_in_flight_holds_the_settled_seq_back_on_postgres() {
    let (ledger, settings) = ledger_on(PolicyBackend::Postgres).await;
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    ledger.append(&[entry("first", "alice", 0)]).await.unwrap();
    let seq_of = |id: &str| {
        let pool = pool.clone();
        let id = super::entry(id, "alice", 0).id.to_string();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT seq FROM ledger_entries WHERE id = $1")
                .bind(id)
                .fetch_optional(&pool)
                .await
                .unwrap()
        }
    };
    // Another session holds the rollup row of `transfer`'s hour: an append of that hour
    // inserts its entry (taking its `seq`), then waits on the row, uncommitted.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM ledger_hourly WHERE action = 'transfer' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let in_flight = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.append(&[entry("slow", "alice", 1)]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !in_flight.is_finished(),
        "the append waits on its rollup row"
    );
    // An append of another action commits meanwhile, with a higher `seq`.
    let mut later = entry("later", "bob", 2);
    later.action = Action::parse("action", "sms").unwrap();
    ledger.append(&[later]).await.unwrap();
    let later_seq = seq_of("later").await.expect("committed");
    assert_eq!(seq_of("slow").await, None, "not committed yet");

    let settled = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.settled_seq().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !settled.is_finished(),
        "the settled seq waits for the append in flight"
    );
    blocker.commit().await.unwrap();
    assert_eq!(in_flight.await.unwrap().unwrap(), 1);
    let settled = settled.await.unwrap().unwrap().expect("entries");
    let slow_seq = seq_of("slow").await.expect("committed now");
    assert!(
        slow_seq < later_seq,
        "committed out of seq order: {slow_seq} after {later_seq}"
    );
    assert!(settled >= later_seq, "{settled} < {later_seq}");
}

/// With no append in flight, the settled `seq` is the last entry's.
async fn the_settled_seq_is_the_last_entry_when_no_append_is_in_flight(backend: PolicyBackend) {
    let (ledger, _settings) = ledger_on(backend).await;
    assert_eq!(ledger.settled_seq().await.unwrap(), None, "an empty ledger");
    ledger
        .append(&[entry("a", "alice", 0), entry("b", "alice", 1)])
        .await
        .unwrap();
    let last = ledger
        .entries_after(0, 10, None)
        .await
        .unwrap()
        .last()
        .map(|(seq, _)| *seq);
    assert_eq!(ledger.settled_seq().await.unwrap(), last);
}

crate::on_policy_stores!(the_settled_seq_is_the_last_entry_when_no_append_is_in_flight);
