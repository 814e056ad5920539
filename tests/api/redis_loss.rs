//! Redis mode when Redis loses its data (a restart without persistence, a failover to an
//! empty replica, a FLUSHALL): the ledger is the book of record. Every shard carries an
//! epoch that the scripts check in the same call; without it nothing is decided (503 by
//! default), and the service rebuilds the shard's usage and holds from the SQL ledger
//! within seconds. No consume is ever allowed on an empty counter the ledger shows charged.

use crate::helpers::{
    calendar_policy, cluster_urls, eventually, fresh_settings, spawn_with, CounterBackend,
    PolicyBackend, PrivateRedis, TestApp,
};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

/// How soon usage must be the ledger's again.
const WITHIN: Duration = Duration::from_secs(15);

fn policies() -> [Value; 2] {
    [
        calendar_policy("sms-daily", "sms", 5, "day", "UTC"),
        json!({"id": "transfer-daily", "action": "transfer", "measure": "amount",
            "limit": 1_000, "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}),
    ]
}

/// A payment-like consume of u3 with an idempotency key.
fn keyed() -> Value {
    json!({"action": "sms", "subject": "u3", "amount": 1, "idempotency_key": "pay-1"})
}

/// 3 SMS for u1, a keyed SMS for u3 and a hold of 300 for u2, all moved into SQL.
async fn charge(app: &TestApp) -> (String, Value) {
    for policy in policies() {
        app.must_create_policy(policy).await;
    }
    for _ in 0..3 {
        assert_eq!(app.consume("sms", "u1", 1).await.status, StatusCode::OK);
    }
    let paid = app.quota("/quota/consume", keyed()).await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.body);
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u2", "amount": 300, "ttl_seconds": 600}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    app.engine.drain_ledger_now().await;
    let hold_id = hold.body["hold_id"].as_str().unwrap().to_owned();
    (hold_id, paid.body["consumption_id"].clone())
}

/// Deletes every key of `app` (its prefix) on every node: what a FLUSHALL does to it. The
/// shards' epochs go last, as if all at once: a shard is never seen without its epoch
/// while some of its other keys are still there.
pub(crate) async fn lose_keys(app: &TestApp, nodes: &[String]) {
    lose_keys_but(app, nodes, false).await;
}

/// [`lose_keys`], keeping the shards' epochs if `keep_epochs`.
async fn lose_keys_but(app: &TestApp, nodes: &[String], keep_epochs: bool) {
    let passes: &[bool] = if keep_epochs {
        &[false]
    } else {
        &[false, true]
    };
    for &epochs in passes {
        for node in nodes {
            let mut redis = redis::Client::open(node.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let pattern = format!("{}*", app.settings.redis_prefix);
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut redis)
                .await
                .unwrap();
            for key in keys.iter().filter(|k| k.ends_with("#epoch") == epochs) {
                let _: () = redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut redis)
                    .await
                    .unwrap();
            }
        }
    }
}

/// `used` of the sms policy for u1, from a check (charges nothing); `None` while refused.
async fn sms_used(app: &TestApp) -> Option<u64> {
    let answer = app.check("sms", "u1", 1).await;
    match answer.status {
        StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
            answer.body["policies"][0]["used"].as_u64()
        }
        _ => {
            answer.assert_problem(503);
            None
        }
    }
}

/// After the loss: nothing is decided on the empty counters, usage comes back, and the
/// budget and the hold go on exactly where the ledger left them.
async fn comes_back_from_the_ledger(app: &TestApp, (hold_id, paid): &(String, Value)) {
    // Right after the loss: refused (the shard has no epoch), or already rebuilt.
    let first = app.consume("sms", "u1", 1).await;
    match first.status {
        StatusCode::OK => assert_eq!(first.body["policies"][0]["used"], 4, "{}", first.body),
        _ => {
            first.assert_problem(503);
        }
    }
    let used = eventually(WITHIN, "usage is the ledger's again", || async {
        sms_used(app).await
    })
    .await;
    assert!(used == 3 || used == 4, "used {used}");
    let mut allowed = used;
    while app.consume("sms", "u1", 1).await.status == StatusCode::OK {
        allowed += 1;
        assert!(allowed <= 5, "over the limit");
    }
    assert_eq!(allowed, 5, "the 6th SMS of the day is denied");
    // The hold's shard may still be closed (503, nothing done): retrying is safe.
    let commit = eventually(WITHIN, "the hold is back", || async {
        let commit = app
            .quota(
                &format!("/quota/holds/{hold_id}/commit"),
                json!({"amount": 250}),
            )
            .await;
        (commit.status != StatusCode::SERVICE_UNAVAILABLE).then_some(commit)
    })
    .await;
    assert_eq!(commit.status, StatusCode::OK, "{}", commit.body);
    let again = app
        .quota(&format!("/quota/holds/{hold_id}/commit"), json!({}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    let usage = app.usage("transfer", "u2").await;
    assert_eq!(usage.body["policies"][0]["used"], 250, "{}", usage.body);
    // The retry of a keyed consume replays its answer, and charges nothing.
    let retry = app.quota("/quota/consume", keyed()).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["replayed"], true, "{}", retry.body);
    assert_eq!(&retry.body["consumption_id"], paid);
    let usage = app.usage("sms", "u3").await;
    assert_eq!(usage.body["policies"][0]["used"], 1, "{}", usage.body);
    // And every budget is the ledger's.
    crate::integrity::assert_no_drift(app).await;
}

#[tokio::test]
async fn a_redis_restarted_without_persistence_is_rebuilt_from_the_ledger() {
    let redis = PrivateRedis::start().await;
    let port = redis.port();
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    let app = spawn_with(settings).await;
    let charged = charge(&app).await;

    drop(redis); // killed: no persistence, everything it held is gone
    let _redis = PrivateRedis::start_on(port).await;
    comes_back_from_the_ledger(&app, &charged).await;
}

#[tokio::test]
async fn a_redis_that_lost_its_keys_is_rebuilt_from_the_ledger() {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await).await;
    let charged = charge(&app).await;
    lose_keys(&app, &app.settings.redis_urls.clone()).await;
    comes_back_from_the_ledger(&app, &charged).await;
}

/// With a checkpoint of the ledger's replay, a rebuild reads only the entries after it,
/// and comes back exactly where the ledger left every budget, hold and kept answer.
async fn a_rebuild_replays_only_the_entries_after_the_checkpoint(counters: CounterBackend) {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, counters).await).await;
    let charged = charge(&app).await;
    let saved = app.engine.checkpoint_now().await.expect("checkpointing");
    assert_eq!(
        saved.map(|s| s.covered_seq),
        Some(5),
        "3 SMS, a keyed SMS and a hold"
    );
    for _ in 0..2 {
        assert_eq!(app.consume("sms", "u9", 1).await.status, StatusCode::OK);
    }
    app.engine.drain_ledger_now().await;
    // The janitor's first look (when it takes the lease) would rebuild the shards by
    // itself: let it pass, so that the rebuild below is the one that reads the ledger.
    eventually(WITHIN, "the janitor's lease is taken", || async {
        app.engine.janitor().held().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    lose_keys(&app, &app.settings.redis_urls.clone()).await;
    let reopened = app.engine.rebuild_counters(None).await.expect("rebuilding");
    assert_eq!(
        reopened.entries, 2,
        "only u9's SMS, after the checkpoint, are read"
    );
    assert_eq!(app.usage("sms", "u9").await.body["policies"][0]["used"], 2);
    comes_back_from_the_ledger(&app, &charged).await;
}

/// `sql` (one number) on the ledger of `app`, Postgres or SQLite.
async fn sql_number(app: &TestApp, sql: &str) -> i64 {
    let url = &app.settings.database_url;
    let number: Option<i64> = if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url)
            .await
            .expect("opening the ledger");
        let number = sqlx::query_scalar(sql).fetch_one(&pool).await;
        pool.close().await;
        number.expect("reading the ledger")
    } else {
        let pool = sqlx::SqlitePool::connect(url)
            .await
            .expect("opening the ledger");
        let number = sqlx::query_scalar(sql).fetch_one(&pool).await;
        pool.close().await;
        number.expect("reading the ledger")
    };
    number.unwrap_or(0)
}

/// The janitor's checkpoints save the whole state once, then only what changed: after a
/// snapshot, deltas follow (a hold released, new counters); a rebuild loads the snapshot
/// and its deltas and reads no entry after them, and every budget, hold and kept answer
/// comes back as the ledger says.
#[tokio::test]
async fn checkpoints_after_the_first_save_only_what_changed_and_a_rebuild_applies_them() {
    checkpoints_save_what_changed(PolicyBackend::Sqlite).await;
}

#[tokio::test]
async fn checkpoints_save_only_what_changed_on_postgres_too() {
    checkpoints_save_what_changed(PolicyBackend::Postgres).await;
}

async fn checkpoints_save_what_changed(ledger: PolicyBackend) {
    let mut settings = fresh_settings(ledger, CounterBackend::Redis).await;
    settings.checkpoint_every = Some(Duration::from_secs(1));
    let app = spawn_with(settings).await;
    let charged = charge(&app).await;
    let released = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u7", "amount": 100, "ttl_seconds": 600}),
        )
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    app.engine.drain_ledger_now().await;
    let covers_the_ledger = |table: &'static str| {
        let app = &app;
        async move {
            let last = sql_number(app, "SELECT MAX(seq) FROM ledger_entries").await;
            let covered = sql_number(app, &format!("SELECT MAX(covered_seq) FROM {table}")).await;
            (covered == last).then_some(())
        }
    };
    eventually(Duration::from_secs(20), "a full checkpoint", || {
        covers_the_ledger("counter_snapshots")
    })
    .await;
    let full_bytes = sql_number(
        &app,
        "SELECT CAST(SUM(LENGTH(data)) AS BIGINT) FROM counter_snapshots",
    )
    .await;

    let hold_id = released.body["hold_id"].as_str().unwrap();
    let release = app
        .quota(&format!("/quota/holds/{hold_id}/release"), json!({}))
        .await;
    assert_eq!(release.status, StatusCode::OK, "{}", release.body);
    for _ in 0..2 {
        assert_eq!(app.consume("sms", "u9", 1).await.status, StatusCode::OK);
    }
    app.engine.drain_ledger_now().await;
    eventually(Duration::from_secs(20), "a delta", || {
        covers_the_ledger("counter_snapshot_deltas")
    })
    .await;
    assert_eq!(app.consume("sms", "u8", 1).await.status, StatusCode::OK);
    app.engine.drain_ledger_now().await;
    eventually(Duration::from_secs(20), "a second delta", || {
        covers_the_ledger("counter_snapshot_deltas")
    })
    .await;
    let deltas = sql_number(
        &app,
        "SELECT COUNT(DISTINCT covered_seq) FROM counter_snapshot_deltas",
    )
    .await;
    assert!(deltas >= 2, "{deltas} deltas");
    let last_delta = sql_number(
        &app,
        "SELECT CAST(LENGTH(data) AS BIGINT) FROM counter_snapshot_deltas ORDER BY covered_seq DESC LIMIT 1",
    )
    .await;
    assert!(
        last_delta < full_bytes,
        "the last delta ({last_delta} bytes) holds u8's counter, not the state ({full_bytes})"
    );

    eventually(WITHIN, "the janitor's lease is taken", || async {
        app.engine.janitor().held().then_some(())
    })
    .await;
    lose_keys(&app, &app.settings.redis_urls.clone()).await;
    let reopened = app.engine.rebuild_counters(None).await.expect("rebuilding");
    assert_eq!(
        reopened.entries, 0,
        "every entry is in the checkpoint's deltas"
    );
    assert_eq!(app.usage("sms", "u9").await.body["policies"][0]["used"], 2);
    assert_eq!(app.usage("sms", "u8").await.body["policies"][0]["used"], 1);
    assert_eq!(
        app.usage("transfer", "u7").await.body["policies"][0]["used"],
        0,
        "the released hold stays released"
    );
    let again = app
        .quota(&format!("/quota/holds/{hold_id}/release"), json!({}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    comes_back_from_the_ledger(&app, &charged).await;
}

#[tokio::test]
async fn a_rebuild_replays_only_the_entries_after_the_checkpoint_on_redis() {
    a_rebuild_replays_only_the_entries_after_the_checkpoint(CounterBackend::Redis).await;
}

#[tokio::test]
async fn a_rebuild_replays_only_the_entries_after_the_checkpoint_on_the_cluster() {
    a_rebuild_replays_only_the_entries_after_the_checkpoint(CounterBackend::Cluster).await;
}

#[tokio::test]
async fn a_redis_cluster_that_lost_its_keys_is_rebuilt_from_the_ledger() {
    let app =
        spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Cluster).await).await;
    let charged = charge(&app).await;
    lose_keys(&app, &cluster_urls()).await;
    comes_back_from_the_ledger(&app, &charged).await;
}

/// Redis restored from an old backup: counters as they were before the day's charges,
/// epochs still there, so nothing detects it; the operator rebuilds on demand.
async fn forget_the_day(app: &TestApp) {
    // The service rebuilds every shard without an epoch by itself, when its janitor looks
    // (first when it takes the lease, then every 30 s): let that first look pass, so that
    // only the rebuild on demand runs while the shards are closed. And the epochs are never
    // missing meanwhile.
    eventually(WITHIN, "the janitor's lease is taken", || async {
        app.engine.janitor().held().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    set_old_epochs(app).await;
    lose_keys_but(app, &app.settings.redis_urls.clone(), true).await;
    assert_eq!(
        sms_used(app).await,
        Some(0),
        "the old backup forgot the day"
    );
}

/// Every shard's epoch set to one no rebuild wrote.
async fn set_old_epochs(app: &TestApp) {
    let mut redis = redis::Client::open(app.settings.redis_urls[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for shard in 0..quota_ledger::keys::SHARDS {
        let epoch = format!(
            "{}#epoch",
            quota_ledger::keys::ledger_stream(&app.settings.redis_prefix, shard)
                .trim_end_matches("#ledger")
        );
        let _: () = redis::cmd("SET")
            .arg(epoch)
            .arg("old")
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn counters_rebuild_on_demand_puts_back_what_the_ledger_says() {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await).await;
    let charged = charge(&app).await;
    forget_the_day(&app).await;
    let rebuilt = app.engine.rebuild_counters(None).await.expect("rebuilding");
    assert_eq!(
        rebuilt.shards.len(),
        usize::from(quota_ledger::keys::SHARDS)
    );
    assert_eq!(sms_used(&app).await, Some(3));
    comes_back_from_the_ledger(&app, &charged).await;
}

#[tokio::test]
async fn counters_rebuild_of_one_action_leaves_the_other_actions_keys_alone() {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await).await;
    let (hold_id, paid) = charge(&app).await;
    forget_the_day(&app).await;
    let sms = quota_ledger::domain::Action::parse("action", "sms").unwrap();
    app.engine
        .rebuild_counters(Some(&sms))
        .await
        .expect("rebuilding sms");
    assert_eq!(sms_used(&app).await, Some(3));
    let retry = app.quota("/quota/consume", keyed()).await;
    assert_eq!(retry.body["replayed"], true, "{}", retry.body);
    assert_eq!(retry.body["consumption_id"], paid);
    // The transfer hold was not rebuilt: Redis still has no record of it.
    let commit = app
        .quota(&format!("/quota/holds/{hold_id}/commit"), json!({}))
        .await;
    assert_eq!(commit.status, StatusCode::NOT_FOUND, "{}", commit.body);
}

#[test]
fn the_binary_refuses_to_rebuild_counters_it_keeps_in_process() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"))
        .args(["counters", "rebuild", "--action", "sms"])
        .env("DATABASE_URL", "sqlite::memory:")
        .env_remove("REDIS_URL")
        .output()
        .expect("running the binary");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("REDIS_URL is not set"), "{stderr}");
}

/// A budget shared by subjects (here the whole action's) lives in a shard of its own,
/// charged from every subject's shard: its usage comes back from the entries of all of them.
#[tokio::test]
async fn a_global_budget_is_rebuilt_from_the_entries_of_every_subject() {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await).await;
    app.must_create_policy(
        json!({"id": "sms-platform", "action": "sms", "measure": "count",
        "limit": 10, "scope": [], "window": {"type": "calendar", "period": "day"}}),
    )
    .await;
    for subject in ["u1", "u2", "u3", "u4", "u5", "u6"] {
        let answer = app.consume("sms", subject, 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    app.engine.drain_ledger_now().await;
    lose_keys(&app, &[std::env::var("QUOTA_TEST_REDIS_URL").unwrap()]).await;
    let used = eventually(
        WITHIN,
        "the global budget is the ledger's again",
        || async {
            let answer = app.check("sms", "u9", 1).await;
            (answer.status == StatusCode::OK).then(|| answer.body["policies"][0]["used"].clone())
        },
    )
    .await;
    assert_eq!(used, 6, "every subject's charge counts again");
    let mut allowed = 6;
    for subject in ["a", "b", "c", "d", "e", "f"] {
        // The subject's own shard may still be closed (503, nothing done): retry.
        let status = eventually(WITHIN, "the subject's shard is open", || async {
            let status = app.consume("sms", subject, 1).await.status;
            (status != StatusCode::SERVICE_UNAVAILABLE).then_some(status)
        })
        .await;
        if status == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10, "the platform-wide cap holds after the rebuild");
}
