//! Replicated answers (`QUOTA_REDIS_MIN_REPLICAS`): a consume that charged is answered 200
//! only once a replica acknowledged it, so a failover to that replica loses no answered
//! charge, even when the replica's link stalled just before the primary died; a replica
//! that stops acknowledging makes consumes 503 and leaves no charge.

use crate::helpers::{
    calendar_policy, eventually, fresh_settings, keyed_consume, spawn_with, CounterBackend,
    KeyedLoad, PolicyBackend, PrivateRedis, TestApp,
};
use crate::integrity::verify;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A primary with one replica that has caught up.
async fn primary_and_replica() -> (PrivateRedis, PrivateRedis) {
    let primary = PrivateRedis::start().await;
    let replica = PrivateRedis::start_with(
        crate::helpers::free_port(),
        &["--replicaof", "127.0.0.1", &primary.port().to_string()],
    )
    .await;
    eventually(Duration::from_secs(10), "the replica is online", || async {
        primary
            .cli(None, &["INFO", "replication"])
            .contains("state=online")
            .then_some(())
    })
    .await;
    (primary, replica)
}

/// An app on `redis` requiring one replica, with a day budget for `repl.send`.
async fn app_on(redis: &PrivateRedis, policy: PolicyBackend) -> TestApp {
    let mut settings = fresh_settings(policy, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_min_replicas = 1;
    // WAIT gets half of it: room for a busy machine to acknowledge.
    settings.redis_timeout = Duration::from_millis(2_000);
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy(
        "repl-daily",
        "repl.send",
        1_000_000,
        "day",
        "UTC",
    ))
    .await;
    app
}

fn keyed(key: &str) -> serde_json::Value {
    keyed_consume("repl.send", key)
}

#[tokio::test]
async fn a_replica_that_stops_acknowledging_makes_consumes_503_and_leaves_no_charge() {
    let (primary, replica) = primary_and_replica().await;
    let app = app_on(&primary, PolicyBackend::Sqlite).await;
    assert_eq!(app.quota("/quota/consume", keyed("k-1")).await.status, 200);

    replica.pause();
    let refused = app.quota("/quota/consume", keyed("k-2")).await;
    let problem = refused.assert_problem(503);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("QUOTA_REDIS_MIN_REPLICAS"),
        "{problem}"
    );
    // The charge Redis made is given back (a void entry), and nothing else is left.
    app.engine.void_settled(true).await;
    replica.resume();
    let usage = app.usage("repl.send", "u-1").await;
    assert_eq!(usage.body["policies"][0]["used"], 1, "{}", usage.body);
    app.engine.drain_ledger_now().await;
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");

    // Acknowledged again: served again, and the retry of the refused key is decided afresh.
    let retried = app.quota("/quota/consume", keyed("k-2")).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.body["replayed"], false);
    assert_eq!(
        app.usage("repl.send", "u-1").await.body["policies"][0]["used"],
        2
    );
}

#[tokio::test]
async fn with_too_few_replicas_readyz_is_503_naming_the_setting() {
    let primary = PrivateRedis::start().await;
    let app = app_on(&primary, PolicyBackend::Sqlite).await;
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready.body["reasons"][0]
            .as_str()
            .unwrap()
            .contains("QUOTA_REDIS_MIN_REPLICAS is 1"),
        "{}",
        ready.body
    );
    // A consume that would charge is refused, and charges nothing.
    let refused = app.quota("/quota/consume", keyed("k-1")).await;
    refused.assert_problem(503);
    app.engine.void_settled(true).await;
    assert_eq!(
        app.usage("repl.send", "u-1").await.body["policies"][0]["used"],
        0
    );
}

#[tokio::test]
async fn a_failover_to_the_replica_loses_no_answered_charge() {
    let (mut primary, replica) = primary_and_replica().await;
    let app = Arc::new(app_on(&primary, PolicyBackend::Postgres).await);
    let load = KeyedLoad::start(&app, "repl.send", 8);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The replica's link drops (and it cannot reconnect), then the primary dies under load;
    // the replica is promoted.
    replica.pause();
    let dropped = primary.cli(None, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(dropped.trim(), "1", "the replica's link was dropped");
    tokio::time::sleep(Duration::from_millis(400)).await;
    primary.kill_9();
    replica.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answered = load.stop().await;
    let promoted = replica.cli(None, &["REPLICAOF", "NO", "ONE"]);
    assert!(promoted.contains("OK"), "{promoted}");

    // A new instance on the promoted replica and the same ledger.
    let mut settings = app.settings.clone();
    settings.redis_urls = vec![replica.url.clone()];
    settings.redis_min_replicas = 0;
    let after = spawn_with(settings).await;
    after.engine.drain_ledger_now().await;
    assert!(
        answered.len() > 50,
        "the load was served: {}",
        answered.len()
    );
    KeyedLoad::assert_replayed(&after, "repl.send", &answered).await;
    after.engine.drain_ledger_now().await;
    let mut recorded = std::collections::BTreeSet::new();
    let mut cursor = String::new();
    loop {
        let page = after
            .send(after.client.get(format!(
                "{}/quota/ledger?action=repl.send&kind=charge&limit=100{cursor}",
                after.address
            )))
            .await;
        assert_eq!(page.status, 200, "{}", page.body);
        for entry in page.body["items"].as_array().unwrap() {
            recorded.insert(entry["consumption_id"].as_str().unwrap().to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    for (key, id) in &answered {
        assert!(recorded.contains(id), "{key}'s charge is in the ledger");
    }
    let verified = verify(&after).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
}
