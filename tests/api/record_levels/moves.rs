//! Consumes recorded in the totals on Redis: each waits in its shard's hash (no stream
//! entry), and the drain moves a shard's hash into SQL as a few folded rows, once, however
//! often a move is interrupted. A verify finds them wherever they are: waiting, moving, or
//! in SQL with their move not ended.

use super::{burst, daily, totals, verify_finds_no_drift};
use crate::helpers::{app_with, CounterBackend, TestApp};
use quota_ledger::engine::faults::Fault;
use quota_ledger::keys::{ledger_stream, totals_moving, totals_waiting, SHARDS};
use reqwest::StatusCode;
use serde_json::json;

/// Consumes waiting in the hashes (moving ones included) and entries in the streams.
async fn in_redis(app: &TestApp) -> (u64, u64) {
    let url = app.settings.redis_urls[0].as_str();
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let prefix = &app.settings.redis_prefix;
    let (mut hashed, mut streamed) = (0, 0);
    for shard in 0..SHARDS {
        for key in [totals_waiting(prefix, shard), totals_moving(prefix, shard)] {
            let fields: Vec<String> = redis::cmd("HKEYS")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            hashed += fields.iter().filter(|f| *f != "#").count() as u64;
        }
        let len: u64 = redis::cmd("XLEN")
            .arg(ledger_stream(prefix, shard))
            .query_async(&mut redis)
            .await
            .unwrap();
        streamed += len;
    }
    (hashed, streamed)
}

/// Rows of the ledger per kind: (kind, rows, requests they stand for).
async fn rows(app: &TestApp) -> Vec<(String, i64, i64)> {
    let pool = sqlx::SqlitePool::connect(&app.settings.database_url)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT kind, COUNT(*), CAST(SUM(COALESCE(folded, 1)) AS INTEGER) FROM ledger_entries \
         GROUP BY kind ORDER BY kind",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
}

/// A verify without draining first: it must find the consumes where they are.
async fn verify_as_is(app: &TestApp) {
    let verified = app.admin_get("/admin/counters/verify").await;
    assert_eq!(verified.status, StatusCode::OK, "{}", verified.body);
    assert_eq!(verified.body["drift"], json!([]), "{}", verified.body);
    assert_eq!(verified.body["checked"], json!(30), "{}", verified.body);
}

async fn every_total_is_exact(app: &TestApp) {
    let (rows, _) = totals(app).await;
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(
        rows.iter().all(|r| (r.2, r.3, r.4) == (6, 6, 4)),
        "{rows:?}"
    );
}

async fn app() -> TestApp {
    app_with(
        CounterBackend::Redis,
        &[daily("sms-day", "sms", 6, "totals")],
    )
    .await
}

#[tokio::test]
async fn consumes_wait_in_their_shards_hash_and_move_into_sql_as_folded_rows() {
    let app = app().await;
    // The drain waits at its first move: the consumes stay in Redis meanwhile.
    app.engine.faults().arm_with("drain.move", Fault::Hold);
    burst(&app).await;
    assert_eq!(
        in_redis(&app).await,
        (300, 0),
        "in the hashes, none in a stream"
    );
    verify_as_is(&app).await;

    app.engine.faults().clear();
    app.engine.drain_ledger_now().await;
    assert_eq!(in_redis(&app).await, (0, 0));
    let rows = rows(&app).await;
    let stands_for: Vec<(&str, i64)> = rows.iter().map(|r| (r.0.as_str(), r.2)).collect();
    assert_eq!(stands_for, [("charge", 180), ("deny", 120)]);
    let written: i64 = rows.iter().map(|r| r.1).sum();
    assert!(written < 300, "{written} rows for 300 consumes: {rows:?}");
    every_total_is_exact(&app).await;
    verify_finds_no_drift(&app).await;
}

#[tokio::test]
async fn a_move_whose_end_failed_is_moved_again_and_counted_once() {
    let app = app().await;
    app.engine.faults().arm("drain.moved");
    burst(&app).await;
    // Each pass inserts a shard's rows and fails to end its move; the next hands the
    // same content out again, whose rows are inserted already.
    app.engine.drain_ledger_now().await;
    app.engine.drain_ledger_now().await;
    let (hashed, _) = in_redis(&app).await;
    assert_eq!(hashed, 300, "no move was ended");
    let (moved, _) = totals(&app).await;
    assert!(!moved.is_empty(), "a shard's rows are in SQL");
    // Handed out again and again, a content's rows count once (the background drain may
    // have moved a shard mid-burst: its row holds what its hash held then).
    assert!(
        moved.iter().all(|r| r.3 <= 6 && r.3 + r.4 <= 10),
        "{moved:?}"
    );
    // In SQL and still in Redis: a verify counts them once.
    verify_as_is(&app).await;

    app.engine.faults().clear();
    app.engine.drain_ledger_now().await;
    assert_eq!(in_redis(&app).await, (0, 0));
    every_total_is_exact(&app).await;
    verify_finds_no_drift(&app).await;
}

#[tokio::test]
async fn a_consume_answered_503_while_it_waits_in_its_hash_is_voided() {
    let app = app().await;
    app.engine.faults().arm_with("drain.move", Fault::Hold);
    assert_eq!(app.consume("sms", "s-1", 1).await.status, StatusCode::OK);
    app.engine.faults().arm("store.reply_lost");
    let lost = app.consume("sms", "s-1", 1).await;
    lost.assert_problem(503);
    let settled = app.engine.void_settled(true).await;
    assert_eq!(format!("{settled:?}"), "[Voided]");
    app.engine.faults().clear();
    app.engine.drain_ledger_now().await;
    assert_eq!(in_redis(&app).await, (0, 0));
    let (rows, _) = totals(&app).await;
    assert_eq!(rows, [("sms-day".into(), "s-1".into(), 1, 1, 0)]);
    let usage = app.usage("sms", "s-1").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(1),
        "{}",
        usage.body
    );
    verify_finds_no_drift(&app).await;
}
