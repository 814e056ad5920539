//! Fast starts: a graceful stop snapshots the in-process counters, and the next start
//! loads the snapshot and replays only the ledger entries after it. Answers are the same
//! as without a restart, after a graceful restart, after a kill -9 following one, and when
//! the snapshot no longer matches the ledger (the start then replays the whole horizon).

use super::{consume_body, hold_800, ledger_of, refund, transfer_app, usage};
use crate::helpers::{
    calendar_policy, eventually, fresh_settings, spawn_with, Answer, CounterBackend, PolicyBackend,
    TestApp,
};
use crate::on_policy_stores;
use quota_ledger::engine::Restored;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

/// How the app's start rebuilt its counters.
fn restored(app: &TestApp) -> Restored {
    app.restored
        .expect("the embedded default reports its start")
}

/// Entries in the app's ledger (every kind, every subject).
async fn ledger_entries(app: &TestApp) -> usize {
    let answer = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?limit=1000", app.address)),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["items"].as_array().map_or(0, Vec::len)
}

/// What a restart must not change: usage, a check, and a keyed retry's answer.
async fn answers(app: &TestApp) -> (Value, Value, Value) {
    let check = app.quota("/quota/check", consume_body(100, None)).await;
    let retry = app
        .quota("/quota/consume", consume_body(200, Some("pay-1")))
        .await;
    (usage(app).await, check.body, retry.body)
}

async fn a_graceful_restart_loads_the_snapshot_and_replays_nothing(store: PolicyBackend) {
    let app = transfer_app(store).await;
    assert_eq!(restored(&app).snapshot_seq, None, "a first start has none");
    let paid = app
        .quota("/quota/consume", consume_body(200, Some("pay-1")))
        .await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.body);
    hold_800(&app, 600).await;
    app.advance(5);
    let before = answers(&app).await;
    let entries = ledger_entries(&app).await;

    let app = app.restart().await;
    let start = restored(&app);
    assert_eq!(
        start.snapshot_seq,
        Some(entries as i64),
        "covers every entry"
    );
    assert_eq!(start.entries, 0, "nothing to replay after it");
    assert!(
        start.loaded >= 5,
        "counters, records and the hold: {start:?}"
    );
    assert_eq!(answers(&app).await, before);
    let denied = app.quota("/quota/consume", consume_body(50, None)).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
}

async fn a_crash_after_a_graceful_restart_replays_only_what_came_after(store: PolicyBackend) {
    let app = transfer_app(store).await;
    app.quota("/quota/consume", consume_body(200, Some("pay-1")))
        .await;
    let app = app.restart().await;
    let covered = restored(&app).snapshot_seq;
    app.quota("/quota/consume", consume_body(300, None)).await;
    app.advance(10);
    let before = answers(&app).await;

    let app = app.crash_restart().await;
    let start = restored(&app);
    assert_eq!(start.snapshot_seq, covered, "the last graceful stop's");
    assert_eq!(start.entries, 1, "the consume after it");
    assert_eq!(answers(&app).await, before);
    let third = app.quota("/quota/consume", consume_body(100, None)).await;
    assert_eq!(third.status, StatusCode::OK, "{}", third.body);
    let fourth = app.quota("/quota/consume", consume_body(1, None)).await;
    assert_eq!(
        fourth.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        fourth.body
    );
}

async fn a_hold_opened_before_the_snapshot_and_committed_after_it_stays_committed(
    store: PolicyBackend,
) {
    let app = transfer_app(store).await;
    let id = hold_800(&app, 600).await;
    let app = app.restart().await;
    let commit = app
        .quota(&format!("/quota/holds/{id}/commit"), json!({"amount": 300}))
        .await;
    assert_eq!(commit.status, StatusCode::OK, "{}", commit.body);
    let before = usage(&app).await;
    assert_eq!(before[1]["used"], 300);

    let app = app.crash_restart().await;
    assert_eq!(restored(&app).entries, 1, "the commit is replayed");
    assert_eq!(
        usage(&app).await,
        before,
        "the unsettled 500 stays given back"
    );
    app.quota(&format!("/quota/holds/{id}/release"), json!({}))
        .await
        .assert_problem(409);
}

async fn a_refund_after_the_snapshot_of_a_charge_before_it_still_caps_refunds(
    store: PolicyBackend,
) {
    let app = transfer_app(store).await;
    let charge = app.quota("/quota/consume", consume_body(600, None)).await;
    let id = charge.body["consumption_id"].clone();
    assert_eq!(refund(&app, &id, Some(100)).await.status, StatusCode::OK);
    let app = app.restart().await;
    assert_eq!(refund(&app, &id, Some(200)).await.status, StatusCode::OK);

    let app = app.crash_restart().await;
    assert_eq!(restored(&app).entries, 1, "the refund is replayed");
    assert_eq!(usage(&app).await[1]["used"], 300);
    refund(&app, &id, Some(301)).await.assert_problem(409);
    let rest = refund(&app, &id, None).await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    assert_eq!(rest.body["entry"]["amount"], 300);
    assert_eq!(ledger_of(&app, "refund").await.len(), 3);
}

/// Runs `statement` on the app's database; returns how many rows it changed.
async fn sql(app: &TestApp, statement: &str) -> u64 {
    use quota_ledger::db::Pool;
    let pool = quota_ledger::db::open(&app.settings.database_url, 1)
        .await
        .expect("opening the database");
    let done = match &pool {
        Pool::Postgres(pool) => sqlx::query(statement)
            .execute(pool)
            .await
            .map(|d| d.rows_affected()),
        Pool::Sqlite(pool) => sqlx::query(statement)
            .execute(pool)
            .await
            .map(|d| d.rows_affected()),
    };
    done.expect("running the statement")
}

async fn a_snapshot_that_does_not_match_the_ledger_is_ignored_and_deleted(store: PolicyBackend) {
    let cases = [
        "UPDATE counter_snapshots SET covered_seq = covered_seq + 1000",
        "UPDATE counter_snapshots SET format = 99",
        "UPDATE counter_snapshots SET covered_id = 'another-ledger'",
        "UPDATE counter_snapshots SET prefix = 'another-prefix'",
    ];
    for tamper in cases {
        let app = transfer_app(store).await;
        app.quota("/quota/consume", consume_body(200, Some("pay-1")))
            .await;
        hold_800(&app, 600).await;
        let app = app.restart().await;
        assert!(restored(&app).snapshot_seq.is_some(), "{tamper}");
        app.quota("/quota/consume", consume_body(100, None)).await;
        let before = answers(&app).await;
        assert_eq!(sql(&app, tamper).await, 1, "one part: {tamper}");

        let app = app.crash_restart().await;
        let start = restored(&app);
        assert_eq!(start.snapshot_seq, None, "{tamper}: {start:?}");
        assert_eq!(
            start.entries,
            ledger_entries(&app).await,
            "{tamper}: all replayed"
        );
        assert_eq!(answers(&app).await, before, "{tamper}");
        let left = sql(&app, "DELETE FROM counter_snapshots").await;
        assert_eq!(left, 0, "{tamper}: deleted at start, never to match again");
    }
}

/// A transaction holding the ledger's write lock: every insert waits (reads do not)
/// until it is released.
enum LedgerLock {
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
}

impl LedgerLock {
    async fn take(database_url: &str) -> Self {
        use quota_ledger::db::Pool;
        let pool = quota_ledger::db::open(database_url, 1).await;
        match pool.expect("opening the database") {
            Pool::Postgres(pool) => {
                let mut conn = pool.acquire().await.expect("connecting");
                for statement in ["BEGIN", "LOCK TABLE ledger_entries IN EXCLUSIVE MODE"] {
                    sqlx::query(statement)
                        .execute(&mut *conn)
                        .await
                        .expect("locking");
                }
                Self::Postgres(conn)
            }
            Pool::Sqlite(pool) => {
                let mut conn = pool.acquire().await.expect("connecting");
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut *conn)
                    .await
                    .expect("locking");
                Self::Sqlite(conn)
            }
        }
    }

    async fn release(self) {
        let done = match self {
            Self::Postgres(mut conn) => sqlx::query("ROLLBACK").execute(&mut *conn).await.map(drop),
            Self::Sqlite(mut conn) => sqlx::query("ROLLBACK").execute(&mut *conn).await.map(drop),
        };
        done.expect("unlocking");
    }
}

/// A snapshot taken while traffic flows is a consistent cut: a consume decided in the
/// store but whose ledger entry is not committed yet is in the snapshot together with its
/// entry, or in neither, and no consume is decided while the snapshot waits for its cut.
/// Here the ledger is locked while a consume waits to commit, and the snapshot is asked
/// for meanwhile; then another consume comes.
async fn a_snapshot_taken_while_a_consume_commits_counts_it_exactly_once(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let first = app.quota("/quota/consume", consume_body(100, None)).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let lock = LedgerLock::take(&app.settings.database_url).await;
    let consume = |amount| {
        let (client, url) = (app.client.clone(), format!("{}/quota/consume", app.address));
        tokio::spawn(async move {
            let response = client
                .post(url)
                .json(&consume_body(amount, None))
                .send()
                .await;
            Answer::read(response.expect("an answer")).await
        })
    };
    let second = consume(200);
    eventually(Duration::from_secs(5), "the consume decided", || async {
        (usage(&app).await[1]["used"] == 300).then_some(())
    })
    .await;
    let engine = app.engine.clone();
    let snapshot = tokio::spawn(async move { engine.snapshot_now().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = consume(50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let meanwhile = usage(&app).await;
    lock.release().await;
    assert_eq!(
        meanwhile[1]["used"], 300,
        "nothing decided while the cut is taken"
    );
    for answer in [second, third] {
        let answer = answer.await.expect("the consume ran");
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    let saved = snapshot.await.expect("the snapshot ran").expect("saved");
    assert_eq!(
        saved.covered_seq, 2,
        "it waited for the second consume's entry"
    );
    let before = usage(&app).await;
    assert_eq!(before[1]["used"], 350);

    let app = app.crash_restart().await;
    let start = restored(&app);
    assert_eq!(
        (start.snapshot_seq, start.entries),
        (Some(2), 1),
        "{start:?}"
    );
    assert_eq!(usage(&app).await, before);
}

/// A periodic snapshot saves nothing while the ledger has no entry the kept one lacks.
async fn a_periodic_snapshot_is_skipped_while_nothing_was_committed(store: PolicyBackend) {
    let app = transfer_app(store).await;
    app.quota("/quota/consume", consume_body(100, None)).await;
    let app = app.restart().await;
    let covered = restored(&app).snapshot_seq;
    assert_eq!(covered, Some(1));
    app.advance(60);
    assert_eq!(app.engine.snapshot_unless_covered(covered).await, None);
    app.quota("/quota/consume", consume_body(100, None)).await;
    let saved = app.engine.snapshot_unless_covered(covered).await;
    assert_eq!(saved.map(|s| s.covered_seq), Some(2));
}

/// The `seq` the snapshot kept covers, if there is one.
async fn covered_seq(app: &TestApp) -> Option<i64> {
    use quota_ledger::db::Pool;
    let pool = quota_ledger::db::open(&app.settings.database_url, 1)
        .await
        .expect("opening the database");
    let statement = "SELECT MAX(covered_seq) FROM counter_snapshots";
    let covered = match &pool {
        Pool::Postgres(pool) => sqlx::query_scalar(statement).fetch_one(pool).await,
        Pool::Sqlite(pool) => sqlx::query_scalar(statement).fetch_one(pool).await,
    };
    covered.expect("reading the snapshot's seq")
}

/// A busy service does not wait 5 minutes for its next snapshot: once
/// `QUOTA_SNAPSHOT_ENTRIES` entries were committed after the last one, it takes one, so a
/// start after kill -9 replays only the entries after it, whatever the load before.
async fn a_busy_service_snapshots_every_few_entries_so_a_crash_replays_few(store: PolicyBackend) {
    let mut settings = fresh_settings(store, CounterBackend::Memory).await;
    settings.snapshot_entries = 10;
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("sms-day", "sms", 1_000, "day", "UTC"))
        .await;
    let consume = |n: usize| json!({"action": "sms", "subject": format!("u{}", n % 4)});
    for n in 0..25 {
        let answer = app.quota("/quota/consume", consume(n)).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    let what = "a snapshot covering the 25 entries, long before 5 minutes";
    eventually(Duration::from_secs(10), what, || async {
        covered_seq(&app).await.filter(|&seq| seq >= 25)
    })
    .await;
    for n in 25..28 {
        app.quota("/quota/consume", consume(n)).await;
    }
    let app = app.crash_restart().await;
    let start = restored(&app);
    assert_eq!(start.snapshot_seq, Some(25));
    assert_eq!(
        start.entries, 3,
        "only the entries after the snapshot are replayed"
    );
    let usage = app.usage("sms", "u0").await;
    assert_eq!(usage.body["policies"][0]["used"], 7, "{}", usage.body);
}

on_policy_stores!(
    a_busy_service_snapshots_every_few_entries_so_a_crash_replays_few,
    a_periodic_snapshot_is_skipped_while_nothing_was_committed,
    a_snapshot_taken_while_a_consume_commits_counts_it_exactly_once,
    a_graceful_restart_loads_the_snapshot_and_replays_nothing,
    a_crash_after_a_graceful_restart_replays_only_what_came_after,
    a_hold_opened_before_the_snapshot_and_committed_after_it_stays_committed,
    a_refund_after_the_snapshot_of_a_charge_before_it_still_caps_refunds,
    a_snapshot_that_does_not_match_the_ledger_is_ignored_and_deleted,
);
