//! Replicated answers (`QUOTA_REDIS_MIN_REPLICAS`): a consume that charged is answered 200
//! only once a replica acknowledged it, so a failover to that replica loses no answered
//! charge, even when the replica's link stalled just before the primary died; a replica
//! that stops acknowledging makes consumes 503 and leaves no charge, and refunds 503 in
//! doubt.

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
    app_on_deployment(redis, policy, false).await
}

/// [`app_on`], on a Redis Cluster node with `cluster`.
async fn app_on_deployment(redis: &PrivateRedis, policy: PolicyBackend, cluster: bool) -> TestApp {
    let mut settings = fresh_settings(policy, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_cluster = cluster;
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
    a_stalled_replica_refuses_and_the_retry_is_decided_afresh(&app, &replica).await;
}

/// A consume, then `replica` stalls: a consume is 503 naming the setting and its charge
/// is voided, verify is clean; once the replica is back, its retry is decided afresh.
async fn a_stalled_replica_refuses_and_the_retry_is_decided_afresh(
    app: &TestApp,
    replica: &PrivateRedis,
) {
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
    let verified = verify(app).await;
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
async fn a_refund_the_replica_does_not_acknowledge_is_503_and_its_retry_refunds_once() {
    let (primary, replica) = primary_and_replica().await;
    let app = app_on(&primary, PolicyBackend::Sqlite).await;
    let charged = app.quota("/quota/consume", keyed("k-1")).await;
    assert_eq!(charged.status, 200, "{}", charged.body);
    let consumption_id = charged.body["consumption_id"].as_str().unwrap().to_owned();
    let refund = json!({"consumption_id": consumption_id, "idempotency_key": "r-1"});
    // The charge in SQL: the refund finds it without the drain, which waits for the
    // replica too.
    app.engine.drain_ledger_now().await;

    replica.pause();
    let refused = app.quota("/quota/refund", refund.clone()).await;
    let problem = refused.assert_problem(503);
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("QUOTA_REDIS_MIN_REPLICAS") && detail.contains("refund"),
        "{problem}"
    );
    replica.resume();

    let retried = app.quota("/quota/refund", refund).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(
        app.usage("repl.send", "u-1").await.body["policies"][0]["used"],
        0,
        "refunded once"
    );
    app.engine.drain_ledger_now().await;
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
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

/// On a Redis Cluster the `WAIT` goes to the primary of the decision's slot: a cluster
/// primary with one replica serves consumes while the replica acknowledges,
/// answers 503 and leaves no charge while it stalls, and serves again once it is back.
#[tokio::test]
async fn on_a_cluster_a_replica_that_stops_acknowledging_makes_consumes_503() {
    let primary = PrivateRedis::start_cluster().await;
    let replica = PrivateRedis::start_cluster_replica(&primary).await;
    let app = app_on_deployment(&primary, PolicyBackend::Sqlite, true).await;
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    a_stalled_replica_refuses_and_the_retry_is_decided_afresh(&app, &replica).await;
}

/// A consume across Redis Cluster slots (a budget shared by subjects) commits at its home
/// slot's finalize, after its reservations elsewhere were acknowledged: when the replica
/// stalls just then, the finalize's `WAIT` fails, the consume is 503 (never 200 because
/// its intent is found committed), and its charges in every slot are voided.
#[tokio::test]
async fn on_a_cluster_a_finalize_the_replica_does_not_acknowledge_is_503_and_voided() {
    let primary = PrivateRedis::start_cluster().await;
    let replica = PrivateRedis::start_cluster_replica(&primary).await;
    let app = Arc::new(app_on_deployment(&primary, PolicyBackend::Sqlite, true).await);
    let mut shared = calendar_policy("repl-global", "repl.send", 1_000_000, "day", "UTC");
    shared["scope"] = json!([]);
    app.must_create_policy(shared).await;
    assert_eq!(app.quota("/quota/consume", keyed("k-1")).await.status, 200);

    // Held after every reservation was acknowledged, before the home commit.
    app.engine.faults().arm_with(
        "crossslot.finalize",
        quota_ledger::engine::faults::Fault::Hold,
    );
    let consume = {
        let app = app.clone();
        tokio::spawn(async move { app.quota("/quota/consume", keyed("k-2")).await })
    };
    eventually(
        Duration::from_secs(10),
        "the consume reaches its finalize",
        || async { (app.engine.faults().paused() == 1).then_some(()) },
    )
    .await;
    replica.pause();
    app.engine.faults().clear();
    let refused = consume.await.expect("the consume ends");
    let problem = refused.assert_problem(503);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("QUOTA_REDIS_MIN_REPLICAS"),
        "{problem}"
    );
    // Acknowledged again: the void's share in the other slot is given at once too.
    replica.resume();
    app.engine.void_settled(true).await;
    let usage = app.usage("repl.send", "u-1").await;
    let used: Vec<_> = usage.body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["used"].clone())
        .collect();
    assert_eq!(used, [json!(1), json!(1)], "{}", usage.body);
    app.engine.drain_ledger_now().await;
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], json!([]), "{verified}");
}
