//! A Redis that stalls past the deadline (frozen with SIGSTOP, as a long fork, a swap
//! storm or `CLIENT PAUSE` freeze it) cannot charge, when it resumes, the consumes that
//! were answered 503 meanwhile: each call carries the moment its caller stops waiting,
//! and Redis refuses to run it later than that plus the clocks' skew (1 s).

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, CounterBackend, PolicyBackend, PrivateRedis,
};
use reqwest::StatusCode;
use std::time::Duration;

#[tokio::test]
async fn consumes_answered_503_during_a_stall_past_the_deadline_are_never_charged() {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_timeout = Duration::from_millis(200);
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "a", 100, "day", "UTC"))
        .await;
    assert_eq!(app.consume("a", "s", 1).await.status, StatusCode::OK);

    redis.pause();
    for _ in 0..5 {
        app.consume("a", "s", 1).await.assert_problem(503);
    }
    // Past the deadline (200 ms) and the skew (1 s) the calls queued in Redis wait for.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    redis.resume();

    let usage = crate::helpers::eventually(Duration::from_secs(10), "Redis answers", || async {
        let usage = app.usage("a", "s").await;
        (usage.status == StatusCode::OK).then_some(usage)
    })
    .await;
    assert_eq!(usage.body["policies"][0]["used"], 1, "{}", usage.body);
    let entries = super::entries_of(&app, "s").await;
    assert_eq!(
        entries.len(),
        1,
        "only the allowed consume is recorded: {entries:?}"
    );
    super::assert_no_drift(&app).await;
}
