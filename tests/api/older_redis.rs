//! A Redis that comes back older than the ledger (restarted from its last RDB snapshot) is
//! caught by the shards' write generations and rebuilt from the ledger before it decides:
//! every key answered before the crash, whose entry reached SQL, is replayed rather than
//! charged again, and the counters equal the ledger.

use crate::helpers::{
    calendar_policy, eventually, fresh_settings, spawn_with, CounterBackend, KeyedLoad,
    PolicyBackend, PrivateRedis,
};
use crate::integrity::verify;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_redis_restarted_from_an_older_snapshot_is_rebuilt_from_the_ledger_before_it_decides() {
    let policy = calendar_policy("snap-daily", "snap.send", 1_000_000, "day", "UTC");
    restarted_from_an_older_snapshot(policy).await;
}

/// A budget shared by every subject (`scope: []`) lives in another shard than the
/// consumes that charge it, whose entries are in their subject's stream: its shard's floor
/// is raised by the drain too, so that its older counter is caught and rebuilt.
#[tokio::test]
async fn a_budget_shared_by_subjects_is_caught_older_too() {
    let mut policy = calendar_policy("snap-global", "snap.send", 1_000_000, "day", "UTC");
    policy["scope"] = json!([]);
    restarted_from_an_older_snapshot(policy).await;
}

/// Keyed consumes under `policy`, a Redis SAVE, more consumes, kill -9 and a restart from
/// the snapshot: every answered key replays, the usage is every answered one, and verify
/// is clean.
async fn restarted_from_an_older_snapshot(policy: serde_json::Value) {
    let mut redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    let app = Arc::new(spawn_with(settings).await);
    app.must_create_policy(policy).await;

    let load = KeyedLoad::start(&app, "snap.send", 4);
    eventually(
        Duration::from_secs(20),
        "200 consumes before the snapshot",
        || async { (load.served() >= 200).then_some(()) },
    )
    .await;
    // The snapshot Redis will come back to; then more consumes it will not hold.
    assert!(redis.cli(None, &["SAVE"]).contains("OK"));
    let at_snapshot = load.served();
    eventually(
        Duration::from_secs(20),
        "300 consumes after the snapshot",
        || async { (load.served() >= at_snapshot + 300).then_some(()) },
    )
    .await;
    let answered = load.stop().await;
    // Every answered entry is in SQL (the drain records the shards' generations with them).
    app.engine.drain_ledger_now().await;

    redis.kill_9();
    let _restarted = PrivateRedis::start_on(redis.port()).await;
    let loaded = _restarted.cli(None, &["DBSIZE"]);
    assert_ne!(
        loaded.trim(),
        "0",
        "Redis came back from the snapshot: {loaded}"
    );

    // The first decisions find the shard older than its floor: 503 while it is rebuilt.
    let (first_key, first_id) = &answered[answered.len() - 1];
    let first = eventually(Duration::from_secs(30), "the shard is rebuilt", || async {
        let retried = app
            .quota(
                "/quota/consume",
                crate::helpers::keyed_consume("snap.send", first_key),
            )
            .await;
        (retried.status == 200).then_some(retried)
    })
    .await;
    assert_eq!(first.body["replayed"], true, "{}", first.body);
    assert_eq!(
        first.body["consumption_id"].as_str(),
        Some(first_id.as_str())
    );
    KeyedLoad::assert_replayed(&app, "snap.send", &answered).await;

    let usage = app.usage("snap.send", "u-1").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(answered.len()),
        "{}",
        usage.body
    );
    app.engine.drain_ledger_now().await;
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
}

/// A refund to a budget shared by every subject gives back in the budget's shard, though
/// its entry is in the subject's stream: the drain raises the budget shard's floor for
/// refunds too, so that a Redis that came back without the refunds is caught and rebuilt
/// rather than counting them as still used.
#[tokio::test]
async fn refunds_to_a_shared_budget_lost_with_an_older_redis_are_caught() {
    let mut redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    let app = spawn_with(settings).await;
    let mut policy = calendar_policy("snap-global", "snap.send", 1_000_000, "day", "UTC");
    policy["scope"] = json!([]);
    app.must_create_policy(policy).await;

    let mut charged = Vec::new();
    for n in 0..20 {
        let key = format!("c-{n}");
        let answer = app
            .quota(
                "/quota/consume",
                crate::helpers::keyed_consume("snap.send", &key),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        charged.push(answer.body["consumption_id"].as_str().unwrap().to_owned());
    }
    app.engine.drain_ledger_now().await;
    // The snapshot Redis will come back to holds the charges, not the refunds.
    assert!(redis.cli(None, &["SAVE"]).contains("OK"));
    for (n, consumption_id) in charged.iter().take(10).enumerate() {
        let refund = json!({"consumption_id": consumption_id, "idempotency_key": format!("r-{n}")});
        let answer = app.quota("/quota/refund", refund).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    app.engine.drain_ledger_now().await;

    redis.kill_9();
    let _restarted = PrivateRedis::start_on(redis.port()).await;
    let served = eventually(
        Duration::from_secs(30),
        "the shards are rebuilt",
        || async {
            let answer = app
                .quota(
                    "/quota/consume",
                    crate::helpers::keyed_consume("snap.send", "after"),
                )
                .await;
            (answer.status == 200).then_some(answer)
        },
    )
    .await;
    assert_eq!(served.body["replayed"], false, "{}", served.body);
    let usage = app.usage("snap.send", "u-1").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(11),
        "20 charged, 10 refunded, 1 after: {}",
        usage.body
    );
    app.engine.drain_ledger_now().await;
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
}

/// Consumes recorded in totals wait in their shard's hash, which a Redis restored from a
/// snapshot holds again, though the drain moved it since: its content names itself, so
/// moved again it adds nothing, and the totals and the usage are every answered consume
/// once.
#[tokio::test]
async fn consumes_recorded_in_totals_are_counted_once_after_a_redis_restored_from_a_snapshot() {
    let mut redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    let app = spawn_with(settings).await;
    let mut policy = calendar_policy("snap-totals", "snap.sms", 1_000_000, "day", "UTC");
    policy["record"] = json!("totals");
    app.must_create_policy(policy).await;
    let consume = |n: usize| {
        let app = &app;
        async move {
            for _ in 0..n {
                assert_eq!(app.consume("snap.sms", "u-1", 1).await.status, 200);
            }
        }
    };
    consume(100).await;
    app.engine.drain_ledger_now().await;
    // Moves fail from here: the consumes wait in Redis, moving or waiting, when it saves.
    app.engine.faults().arm("drain.move");
    consume(50).await;
    app.engine.drain_ledger_now().await;
    consume(20).await;
    assert!(redis.cli(None, &["SAVE"]).contains("OK"));
    consume(30).await;
    app.engine.faults().clear();
    app.engine.drain_ledger_now().await;
    redis.kill_9();
    let restarted = PrivateRedis::start_on(redis.port()).await;
    assert_ne!(restarted.cli(None, &["DBSIZE"]).trim(), "0");
    // The first decision finds the shard older than its floor: it is rebuilt first.
    eventually(Duration::from_secs(30), "the shard is rebuilt", || async {
        (app.consume("snap.sms", "u-1", 1).await.status == 200).then_some(())
    })
    .await;
    app.engine.drain_ledger_now().await;
    let usage = app.usage("snap.sms", "u-1").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(201),
        "{}",
        usage.body
    );
    let pool = sqlx::PgPool::connect(&app.settings.database_url)
        .await
        .unwrap();
    let allowed: i64 = sqlx::query_scalar(
        "SELECT CAST(SUM(allowed) AS BIGINT) FROM ledger_totals WHERE policy_id = 'snap-totals'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(allowed, 201);
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
}
