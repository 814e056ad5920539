//! Overload is not a store outage: past `QUOTA_MAX_IN_FLIGHT`, quota requests wait for a
//! slot (at most `QUOTA_MAX_QUEUED` of them, at most `QUOTA_QUEUE_WAIT_MS`) or are answered
//! 503 overloaded, admin and health stay responsive, and fail-open never applies.

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, Answer, CounterBackend, PolicyBackend,
    PrivateRedis, TestApp,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use quota_ledger::config::OnStoreError;
use reqwest::StatusCode;
use std::sync::Arc;
use std::time::Duration;

/// An app whose Redis answers only when the test says, serving at most 2 quota requests
/// at once and answering the excess at once (no queue), with a deadline long enough to
/// outlast the pause.
async fn app_with_a_frozen_redis(on_error: OnStoreError) -> (TestApp, PrivateRedis) {
    app_with_redis(on_error, Duration::from_secs(5), 0, Duration::ZERO).await
}

/// The app of [`app_with_a_frozen_redis`], with a Redis deadline of `deadline`, and a queue
/// of `queued` requests waiting at most `wait`.
async fn app_with_redis(
    on_error: OnStoreError,
    deadline: Duration,
    queued: usize,
    wait: Duration,
) -> (TestApp, PrivateRedis) {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = deadline;
    settings.on_store_error = on_error;
    settings.max_in_flight = 2;
    settings.max_queued = queued;
    settings.queue_wait = wait;
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
    // Envoy's gRPC calls share the slots: shed as overloaded too, never let through.
    let grpc = app.grpc.clone().expect("the test settings serve gRPC");
    let mut client = RateLimitServiceClient::connect(grpc).await.unwrap();
    let status = client
        .should_rate_limit(RateLimitRequest {
            domain: "sms".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "subject".to_owned(),
                    value: "w".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        })
        .await
        .expect_err("no slot is free");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("overloaded"), "{status:?}");
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
    assert!(text.contains("quota_overloaded_total 22"), "{text}");
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
    let (app, redis) = app_with_redis(
        OnStoreError::Allow,
        Duration::from_millis(400),
        0,
        Duration::ZERO,
    )
    .await;
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

/// Past the limit a request waits for a slot, and is served when one comes free.
#[tokio::test]
async fn a_request_past_the_limit_waits_for_a_slot_and_is_served() {
    let (app, redis) = app_with_redis(
        OnStoreError::Deny,
        Duration::from_secs(5),
        8,
        Duration::from_secs(10),
    )
    .await;
    let (app, admitted) = freeze_with_two_in_flight(app, &redis).await;
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { app.consume("sms", "late", 1).await }
    });
    crate::helpers::eventually(Duration::from_secs(5), "a request waiting", || {
        let queued = app.admission.queued();
        async move { (queued == 1).then_some(()) }
    })
    .await;
    let text = app
        .send(app.client.get(format!("{}/healthz", app.address)))
        .await;
    assert_eq!(text.status, StatusCode::OK, "health stays responsive");
    redis.resume();
    for task in admitted.into_iter().chain([waiting]) {
        let answer = task.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    assert_eq!(
        app.usage("sms", "late").await.body["policies"][0]["used"],
        1
    );
    let text = app.metrics_text().await;
    assert!(text.contains("quota_overloaded_total 0"), "{text}");
    assert!(text.contains("quota_queued_requests 0"), "{text}");
}

/// A request that gets no slot within `QUOTA_QUEUE_WAIT_MS` is answered 503 overloaded, and
/// charges nothing.
#[tokio::test]
async fn a_request_that_gets_no_slot_in_time_is_answered_overloaded() {
    let wait = Duration::from_millis(300);
    let (app, redis) = app_with_redis(OnStoreError::Allow, Duration::from_secs(5), 8, wait).await;
    let (app, admitted) = freeze_with_two_in_flight(app, &redis).await;
    let started = std::time::Instant::now();
    let shed = app.consume("sms", "late", 1).await;
    let waited = started.elapsed();
    let problem = shed.assert_problem(503);
    assert_eq!(problem["type"], "urn:quota-ledger:problem:overloaded");
    assert_eq!(shed.header("retry-after"), Some("1"));
    assert!(
        waited >= wait && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    redis.resume();
    for task in admitted {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        app.usage("sms", "late").await.body["policies"][0]["used"],
        0
    );
    let text = app.metrics_text().await;
    assert!(text.contains("quota_overloaded_total 1"), "{text}");
    assert!(text.contains("quota_degraded_allows_total 0"), "{text}");
}

/// Saturated while Redis is healthy: 300 consumes at once against 2 slots and a queue of
/// 16 (waiting at most 50 ms), under `allow`. Every answer is a counted 200 or a 503
/// overloaded; the breaker stays closed, no call is taken for a store failure, and nothing
/// is let through unchecked.
#[tokio::test]
async fn saturation_with_a_healthy_redis_never_trips_the_breaker_nor_fails_open() {
    let (app, _redis) = app_with_redis(
        OnStoreError::Allow,
        Duration::from_millis(50),
        16,
        Duration::from_millis(50),
    )
    .await;
    let app = Arc::new(app);
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.consume("sms", "crowd", 1).await })
        })
        .collect();
    let (mut allowed, mut overloaded) = (0, 0);
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status.as_u16() {
            200 => {
                assert_eq!(answer.body["degraded"], false, "{}", answer.body);
                allowed += 1;
            }
            503 => {
                let problem = answer.assert_problem(503);
                assert_eq!(problem["type"], "urn:quota-ledger:problem:overloaded");
                overloaded += 1;
            }
            other => panic!("{other}: {}", answer.body),
        }
    }
    assert!(overloaded > 0, "300 at once against 2 slots and 16 places");
    assert_eq!(
        app.usage("sms", "crowd").await.body["policies"][0]["used"],
        allowed,
        "every 200 was counted"
    );
    let text = app.metrics_text().await;
    for line in [
        "quota_degraded_allows_total 0",
        "quota_counter_store_circuit_open 0",
        "quota_store_errors_total{store=\"counter\",kind=\"timeout\"} 0",
        "quota_store_errors_total{store=\"counter\",kind=\"unavailable\"} 0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // Shed at admission, or (a Redis call that ran out of time while this instance sheds
    // load) answered overloaded by the engine: never taken for a store failure.
    let count = |prefix: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(prefix)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let shed = count("quota_overloaded_total ");
    let late =
        count("quota_requests_total{endpoint=\"consume\",action=\"sms\",result=\"overloaded\"}");
    assert_eq!(shed + late, overloaded, "{text}");
}
