//! Redis settings the service depends on: a Redis that may evict keys is refused, unless an
//! operator accepts the risk.

use crate::helpers::{
    calendar_policy, free_port, fresh_settings, spawn_with, CounterBackend, PolicyBackend,
    PrivateRedis, TestApp,
};
use reqwest::StatusCode;

async fn app_on(redis: &PrivateRedis, allow_eviction: bool) -> TestApp {
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_allow_eviction = allow_eviction;
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "sms", 10, "day", "UTC"))
        .await;
    app
}

#[tokio::test]
async fn a_redis_that_may_evict_keys_is_refused_with_the_fix_unless_an_operator_allows_it() {
    let args = ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"];
    let redis = PrivateRedis::start_with(free_port(), &args).await;

    let refused = app_on(&redis, false).await;
    let answer = refused.consume("sms", "u-1", 1).await;
    let problem = answer.assert_problem(503);
    let detail = problem["detail"].as_str().unwrap_or_default();
    for needle in [
        "maxmemory-policy is 'allkeys-lru'",
        "noeviction",
        "QUOTA_REDIS_ALLOW_EVICTION",
    ] {
        assert!(detail.contains(needle), "{needle} in {detail}");
    }
    let ready = refused
        .send(refused.client.get(format!("{}/readyz", refused.address)))
        .await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);

    let allowed = app_on(&redis, true).await;
    let answer = allowed.consume("sms", "u-1", 1).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
}

#[tokio::test]
async fn a_redis_that_never_evicts_is_served() {
    let args = ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"];
    let redis = PrivateRedis::start_with(free_port(), &args).await;
    let app = app_on(&redis, false).await;
    assert_eq!(app.consume("sms", "u-1", 1).await.status, StatusCode::OK);
}
