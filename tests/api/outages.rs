//! A counter store that cannot be reached gives clear answers, never a hang.

use crate::helpers::{
    calendar_policy, eventually, free_port, fresh_settings, spawn_with, CounterBackend,
    FreshSettings, PolicyBackend, PrivateRedis,
};
use quota_ledger::config::OnStoreError;
use reqwest::StatusCode;

/// Settings pointing Redis at a loopback port where nothing listens.
async fn settings_with_dead_redis(on_error: OnStoreError) -> FreshSettings {
    let port = free_port();
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![format!("redis://127.0.0.1:{port}/")];
    settings.redis_timeout = std::time::Duration::from_millis(200);
    settings.on_store_error = on_error;
    settings
}

#[tokio::test]
async fn with_redis_down_the_service_starts_reports_unready_and_fails_closed() {
    let app = spawn_with(settings_with_dead_redis(OnStoreError::Deny).await).await;
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        ready.header("retry-after"),
        Some("5"),
        "every 503 says when to retry"
    );
    assert_eq!(ready.body["stores"]["counter_store"], "down");
    assert_eq!(ready.body["stores"]["policy_store"], "ok");

    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let started = std::time::Instant::now();
    let answer = app.consume("a", "s", 1).await;
    answer.assert_problem(503);
    assert!(answer.header("retry-after").is_some());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "no hang"
    );
}

#[tokio::test]
async fn with_redis_down_and_fail_open_consumes_are_allowed_and_marked_degraded() {
    let app = spawn_with(settings_with_dead_redis(OnStoreError::Allow).await).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let answer = app.consume("a", "s", 1).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["degraded"], true);
    assert_eq!(answer.body["allowed"], true);
    // It answers consumes (degraded), so it stays in the load balancer.
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    assert_eq!(ready.body["stores"]["counter_store"], "down");
    assert_eq!(ready.body["reasons"], serde_json::json!([]));
}

#[tokio::test]
async fn while_a_shard_is_being_rebuilt_readyz_is_503_and_says_so() {
    let app = spawn_with(fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await).await;
    let redis = redis::Client::open(app.settings.redis_urls[0].as_str()).unwrap();
    let mut redis = redis.get_multiplexed_async_connection().await.unwrap();
    let prefix = app.settings.redis_prefix.clone();
    let readyz = || async {
        app.send(app.client.get(format!("{}/readyz", app.address)))
            .await
    };
    assert_eq!(readyz().await.status, StatusCode::OK);
    // Another instance holds shard 7's rebuild lock, and the shard has lost its epoch.
    let lock = quota_ledger::keys::rebuild_lock(&prefix, 7);
    let _: () = redis::cmd("SET")
        .arg(&lock)
        .arg("another-instance")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(quota_ledger::keys::epoch(&prefix, 7))
        .query_async(&mut redis)
        .await
        .unwrap();
    let ready = readyz().await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    assert_eq!(ready.header("retry-after"), Some("5"));
    assert_eq!(
        ready.body["reasons"],
        serde_json::json!(["1 counter-store shards are being rebuilt from the ledger"])
    );
    // The lock is given up; the shard is rebuilt, and the instance is ready again.
    let _: () = redis::cmd("DEL")
        .arg(&lock)
        .query_async(&mut redis)
        .await
        .unwrap();
    app.engine.rebuild_counters(None).await.unwrap();
    assert_eq!(readyz().await.status, StatusCode::OK);
}

#[tokio::test]
async fn when_redis_comes_back_consumes_resume_without_a_restart() {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = std::time::Duration::from_millis(300);
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    assert_eq!(app.consume("a", "s", 1).await.status, StatusCode::OK);

    let port = redis.port();
    drop(redis);
    app.consume("a", "s", 1).await.assert_problem(503);

    let _again = PrivateRedis::start_on(port).await;
    consumes_resume(&app, "service resumed after Redis returned").await;
}

#[tokio::test]
async fn a_hung_redis_costs_a_few_timeouts_then_fails_fast_until_it_answers_again() {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = std::time::Duration::from_millis(1_000);
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "a", 100, "day", "UTC"))
        .await;
    assert_eq!(app.consume("a", "s", 1).await.status, StatusCode::OK);

    redis.pause();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        app.consume("a", "s", 1).await.assert_problem(503);
        let waited = started.elapsed();
        assert!(
            waited < std::time::Duration::from_secs(3),
            "bounded by the timeout: {waited:?}"
        );
    }
    let started = std::time::Instant::now();
    app.consume("a", "s", 1).await.assert_problem(503);
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_millis(500),
        "with the circuit open a call fails without waiting for the timeout: {waited:?}"
    );

    let metrics = scrape(&app).await;
    assert!(
        metrics.contains("quota_counter_store_circuit_open 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("quota_store_errors_total{store=\"counter\",kind=\"timeout\"} 3"),
        "the three timeouts are counted as such: {metrics}"
    );

    redis.resume();
    consumes_resume(&app, "the circuit closes once Redis answers").await;
    let metrics = scrape(&app).await;
    assert!(
        metrics.contains("quota_counter_store_circuit_open 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("quota_ledger_backlog_entries "),
        "{metrics}"
    );
}

async fn scrape(app: &crate::helpers::TestApp) -> String {
    let url = format!("{}/metrics", app.address);
    app.client
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Consumes until one is allowed; fails with `what` if none is within 10 s.
async fn consumes_resume(app: &crate::helpers::TestApp, what: &str) {
    eventually(std::time::Duration::from_secs(10), what, || async {
        (app.consume("a", "s", 1).await.status == StatusCode::OK).then_some(())
    })
    .await;
}
