//! Voiding: a consume or hold answered 503 whose call Redis ran all the same (it was
//! frozen for less than the call's deadline plus the clocks' skew, so the call ran when it
//! resumed, after its caller had given up) is given back within seconds and recorded as a
//! `void` entry; unless a retry with the same key was answered with its outcome first.

use super::assert_no_drift;
use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, CounterBackend, PolicyBackend, PrivateRedis,
    TestApp,
};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

/// The caller waits 200 ms; Redis stays frozen 100 ms more: it runs the call when it resumes,
/// after the caller answered 503 and well within the deadline plus the skew (1.2 s), even on
/// a machine so loaded that resuming takes most of a second.
async fn frozen_while(app: &TestApp, redis: &PrivateRedis, path: &str, body: Value) -> Value {
    redis.pause();
    let answer = app.quota(path, body).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.resume();
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    answer.body
}

async fn app_on(redis: &PrivateRedis) -> TestApp {
    app_of(redis, CounterBackend::Redis).await
}

async fn app_of(redis: &PrivateRedis, counters: CounterBackend) -> TestApp {
    let mut settings = fresh_settings(PolicyBackend::Postgres, counters).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = Duration::from_millis(200);
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "pay", 10_000, "day", "UTC"))
        .await;
    // A call that needs a new connection to a frozen Redis is never sent: warm it up.
    assert_eq!(
        app.consume("pay", "warm-up", 1).await.status,
        StatusCode::OK
    );
    app
}

async fn used(app: &TestApp) -> Value {
    app.usage("pay", "s").await.body["policies"][0]["used"].clone()
}

/// The ledger's entries of subject `s`, oldest first, as (kind, consumption or hold id).
async fn entries(app: &TestApp) -> Vec<(String, String)> {
    super::entries_of(app, "s").await
}

/// Waits until the ledger shows a void (the voider runs every second, once the call is
/// settled: 200 ms + twice the skew after the 503). On a loaded machine it may take a few
/// tries; past 30 s the failure says what the ledger holds and what settling the doubts
/// left finds.
async fn voided(app: &TestApp) -> Vec<(String, String)> {
    let started = std::time::Instant::now();
    loop {
        let entries = entries(app).await;
        if entries.iter().any(|(kind, _)| kind == "void") {
            return entries;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let left = app.engine.void_settled(true).await;
            panic!("not voided within 30 s: entries {entries:?}; the doubts left: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_consume_answered_503_that_redis_ran_later_is_voided() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    assert_eq!(app.consume("pay", "s", 100).await.status, StatusCode::OK);
    frozen_while(
        &app,
        &redis,
        "/quota/consume",
        json!({"action": "pay", "subject": "s", "amount": 600}),
    )
    .await;

    let entries = voided(&app).await;
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert_eq!(entries[1].0, "charge", "Redis ran it: {entries:?}");
    assert_eq!(
        entries[2],
        ("void".to_owned(), entries[1].1.clone()),
        "{entries:?}"
    );
    assert_eq!(used(&app).await, 1, "only the allowed answer counts");
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_keyed_consume_voided_is_decided_afresh_on_its_retry() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    let pay = json!({"action": "pay", "subject": "s", "amount": 600, "idempotency_key": "pay-1"});
    frozen_while(&app, &redis, "/quota/consume", pay.clone()).await;
    let entries = voided(&app).await;
    assert_eq!(used(&app).await, 0, "{entries:?}");

    let retry = app.quota("/quota/consume", pay).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["replayed"], false, "{}", retry.body);
    assert_ne!(
        retry.body["consumption_id"],
        json!(entries[0].1),
        "a new charge"
    );
    assert_eq!(used(&app).await, 1);
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_keyed_consume_whose_retry_got_its_outcome_is_never_voided() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    let pay = json!({"action": "pay", "subject": "s", "amount": 600, "idempotency_key": "pay-1"});
    frozen_while(&app, &redis, "/quota/consume", pay.clone()).await;
    // The retry comes before the attempt is settled (200 ms + 2 s): it gets the outcome.
    let retry = app.quota("/quota/consume", pay.clone()).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["replayed"], true, "{}", retry.body);

    let settled = app.engine.void_settled(true).await;
    assert_eq!(format!("{settled:?}"), r#"[Kept("replayed")]"#);
    let entries = entries(&app).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(json!(entries[0].1), retry.body["consumption_id"]);
    assert_eq!(
        used(&app).await,
        1,
        "the outcome the client was told stands"
    );
    let again = app.quota("/quota/consume", pay).await;
    assert_eq!(again.body["replayed"], true, "{}", again.body);
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_keyed_retry_with_another_amount_gets_no_outcome_and_the_attempt_is_voided() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    let pay = json!({"action": "pay", "subject": "s", "amount": 600, "idempotency_key": "pay-1"});
    frozen_while(&app, &redis, "/quota/consume", pay.clone()).await;
    let mut other = pay.clone();
    other["amount"] = json!(700);
    let retry = app.quota("/quota/consume", other).await;
    retry.assert_problem(409);

    let settled = app.engine.void_settled(true).await;
    assert_eq!(format!("{settled:?}"), "[Voided]");
    assert_eq!(used(&app).await, 0, "the client was told of no charge");
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn on_a_cluster_a_consume_answered_503_that_redis_ran_later_is_voided() {
    let redis = PrivateRedis::start_cluster().await;
    let app = app_of(&redis, CounterBackend::Cluster).await;
    let pay = json!({"action": "pay", "subject": "s", "amount": 600, "idempotency_key": "k"});
    frozen_while(&app, &redis, "/quota/consume", pay.clone()).await;
    let entries = voided(&app).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(used(&app).await, 0);
    let retry = app.quota("/quota/consume", pay).await;
    assert_eq!(retry.body["replayed"], false, "{}", retry.body);
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_hold_answered_503_that_redis_ran_later_is_voided() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    let hold = json!({"action": "pay", "subject": "s", "amount": 250, "ttl_seconds": 600});
    frozen_while(&app, &redis, "/quota/holds", hold).await;

    let entries = voided(&app).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0].0, "hold");
    assert_eq!(entries[1], ("void".to_owned(), entries[0].1.clone()));
    assert_eq!(used(&app).await, 0);
    let path = format!("/quota/holds/{}/commit", entries[0].1);
    let commit = app.quota(&path, json!({})).await;
    assert_eq!(
        commit.status,
        StatusCode::CONFLICT,
        "a voided hold cannot be settled: {}",
        commit.body
    );
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_void_that_fails_is_tried_again_not_given_up() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    let hold = json!({"action": "pay", "subject": "s", "amount": 250, "ttl_seconds": 600});
    frozen_while(&app, &redis, "/quota/holds", hold).await;
    // Every void of this call fails: Redis does not answer.
    redis.pause();
    let settled = app.engine.void_settled(true).await;
    redis.resume();
    assert!(settled.is_empty(), "nothing could be settled: {settled:?}");

    let entries = voided(&app).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[1], ("void".to_owned(), entries[0].1.clone()));
    assert_eq!(used(&app).await, 0, "the hold answered 503 is given back");
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn an_attempt_redis_never_ran_is_left_alone() {
    let redis = PrivateRedis::start().await;
    let app = app_on(&redis).await;
    redis.pause();
    app.consume("pay", "s", 600).await.assert_problem(503);
    // Past the deadline and the skew: the call is refused when Redis resumes.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    redis.resume();
    app.engine.void_settled(true).await;
    assert!(entries(&app).await.is_empty());
    assert_eq!(used(&app).await, 0);
}

#[tokio::test]
async fn on_a_cluster_a_consume_across_slots_answered_503_is_voided_in_every_slot() {
    let redis = PrivateRedis::start_cluster().await;
    let app = app_of(&redis, CounterBackend::Cluster).await;
    app.must_create_policy(
        json!({"id": "country", "action": "pay", "measure": "amount",
        "limit": 100_000, "scope": ["country"], "window": {"type": "calendar", "period": "month"}}),
    )
    .await;
    let pay = json!({"action": "pay", "subject": "s", "amount": 600, "idempotency_key": "k",
        "attributes": {"country": "NG"}});
    // Redis committed it (the finalize ran); its answer was lost on the way back.
    app.engine.faults().arm("store.reply_lost");
    let answer = app.quota("/quota/consume", pay.clone()).await;
    app.engine.faults().clear();
    answer.assert_problem(503);
    let mut connection = redis.connection().await;
    let reservations: Vec<String> = redis::cmd("KEYS")
        .arg("*#rv*")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        reservations.len(),
        1,
        "the country's budget is in another slot"
    );

    let settled = app.engine.void_settled(true).await;
    assert_eq!(format!("{settled:?}"), "[Voided]");
    let entries = entries(&app).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[1], ("void".to_owned(), entries[0].1.clone()));
    let usage = app
        .send(app.client.get(format!(
            "{}/quota/usage?action=pay&subject=s&attributes[country]=NG",
            app.address
        )))
        .await
        .body;
    let policies = usage["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 2, "{usage}");
    for policy in policies {
        assert_eq!(policy["used"], 0, "given back in both slots: {usage}");
    }
    let retry = app.quota("/quota/consume", pay).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(
        retry.body["replayed"], false,
        "decided afresh: {}",
        retry.body
    );
    assert_no_drift(&app).await;
}
