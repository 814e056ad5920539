//! Overload is not a store outage: past `QUOTA_MAX_IN_FLIGHT`, quota requests are answered
//! 503 overloaded at once, admin and health stay responsive, and fail-open never applies.

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, Answer, CounterBackend, PolicyBackend,
    PrivateRedis, TestApp,
};
use quota_ledger::config::OnStoreError;
use reqwest::StatusCode;
use std::sync::Arc;
use std::time::Duration;

/// An app whose Redis answers only when the test says, serving at most 2 quota requests
/// at once, with a deadline long enough to outlast the pause.
async fn app_with_a_frozen_redis(on_error: OnStoreError) -> (TestApp, PrivateRedis) {
    app_with_redis(on_error, Duration::from_secs(5)).await
}

/// The app of [`app_with_a_frozen_redis`], with a Redis deadline of `deadline`.
async fn app_with_redis(on_error: OnStoreError, deadline: Duration) -> (TestApp, PrivateRedis) {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = deadline;
    settings.on_store_error = on_error;
    settings.max_in_flight = 2;
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "sms", 1_000, "day", "UTC"))
        .await;
    // A first consume loads the script and connects, so the frozen calls below are plain.
    assert_eq!(
        app.consume("sms", "warm-up", 1).await.status,
        StatusCode::OK
    );
    (app, redis)
}

/// Freezes `redis` and starts two consumes, which take both permits and wait on it; returns
/// the app (shared with them) and their answers to come.
async fn freeze_with_two_in_flight(
    app: TestApp,
    redis: &PrivateRedis,
) -> (Arc<TestApp>, Vec<tokio::task::JoinHandle<Answer>>) {
    redis.pause();
    let app = Arc::new(app);
    let admitted = (0..2)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { app.consume("sms", &format!("u-{i}"), 1).await })
        })
        .collect();
    // Not through /metrics: its backlog gauge asks the frozen Redis too.
    crate::helpers::eventually(Duration::from_secs(5), "two requests in flight", || {
        let in_flight = app.admission.in_flight();
        async move { (in_flight == 2).then_some(()) }
    })
    .await;
    (app, admitted)
}

async fn flood_while_redis_is_frozen(on_error: OnStoreError) {
    let (app, redis) = app_with_a_frozen_redis(on_error).await;
    let (app, admitted) = freeze_with_two_in_flight(app, &redis).await;
    // A percent-encoded path routes to the same handler, and is counted too.
    let encoded = app
        .send(
            app.client
                .post(format!("{}/%71uota/consume", app.address))
                .json(&serde_json::json!({"action": "sms", "subject": "x"})),
        )
        .await;
    let problem = encoded.assert_problem(503);
    assert_eq!(problem["type"], "urn:quota-ledger:problem:overloaded");
    let started = std::time::Instant::now();
    for i in 0..20 {
        let shed: Answer = app.consume("sms", &format!("v-{i}"), 1).await;
        let problem = shed.assert_problem(503);
        assert_eq!(problem["type"], "urn:quota-ledger:problem:overloaded");
        assert_eq!(shed.header("retry-after"), Some("1"));
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shed at once, not after the deadline: {:?}",
        started.elapsed()
    );
    let health = app
        .send(app.client.get(format!("{}/healthz", app.address)))
        .await;
    assert_eq!(health.status, StatusCode::OK, "health stays responsive");
    assert_eq!(
        app.admin_get("/admin/policies/p").await.status,
        StatusCode::OK
    );

    redis.resume();
    for task in admitted {
        let answer = task.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.body["degraded"], false, "counted, not let through");
    }
    let text = app.metrics_text().await;
    assert!(text.contains("quota_overloaded_total 21"), "{text}");
    assert!(text.contains("quota_degraded_allows_total 0"), "{text}");
    assert!(
        text.contains("quota_counter_store_circuit_open 0"),
        "{text}"
    );
}

#[tokio::test]
async fn past_the_in_flight_limit_requests_are_shed_as_overloaded() {
    flood_while_redis_is_frozen(OnStoreError::Deny).await;
}

#[tokio::test]
async fn overload_never_fails_open() {
    flood_while_redis_is_frozen(OnStoreError::Allow).await;
}

/// A Redis call that times out while the service sheds load waited behind the flood in
/// the service, most likely: it is answered 503 overloaded, the breaker does not count it,
/// and even under `allow` it is never let through degraded.
#[tokio::test]
async fn a_timeout_while_shedding_is_overload_never_a_degraded_allow() {
    let (app, redis) = app_with_redis(OnStoreError::Allow, Duration::from_millis(400)).await;
    let (app, admitted) = freeze_with_two_in_flight(app, &redis).await;
    for i in 0..5 {
        app.consume("sms", &format!("v-{i}"), 1)
            .await
            .assert_problem(503);
    }
    for task in admitted {
        let answer = task.await.unwrap();
        let problem = answer.assert_problem(503);
        assert_eq!(problem["type"], "urn:quota-ledger:problem:overloaded");
    }
    redis.resume();
    let text = app.metrics_text().await;
    assert!(text.contains("quota_degraded_allows_total 0"), "{text}");
    assert!(
        text.contains("quota_counter_store_circuit_open 0"),
        "{text}"
    );
    let after = app.consume("sms", "w", 1).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    assert_eq!(after.body["degraded"], false);
}
