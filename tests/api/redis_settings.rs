//! Redis settings the service depends on: a Redis that may evict keys is refused, unless an
//! operator accepts the risk, whether it was so when the service connected or became so
//! later; and what Redis reports of its memory is in `/metrics`.

use crate::helpers::{
    calendar_policy, eventually, free_port, fresh_settings, spawn_with, CounterBackend,
    PolicyBackend, PrivateRedis, TestApp,
};
use reqwest::StatusCode;
use std::time::Duration;

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

/// Sets Redis's `maxmemory-policy` on the live server.
async fn set_policy(redis: &PrivateRedis, policy: &str) {
    let mut connection = redis.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(&mut connection)
        .await
        .expect("CONFIG SET");
}

#[tokio::test]
async fn an_eviction_policy_set_on_a_live_redis_is_refused_within_seconds_and_served_again_once_fixed(
) {
    let args = ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"];
    let redis = PrivateRedis::start_with(free_port(), &args).await;
    let app = app_on(&redis, false).await;
    assert_eq!(app.consume("sms", "u-1", 1).await.status, StatusCode::OK);

    set_policy(&redis, "volatile-lru").await;
    // The connection stays open: the instance's periodic look at INFO memory sees it.
    let detail = eventually(Duration::from_secs(15), "decisions are refused", || async {
        let answer = app.check("sms", "u-1", 1).await;
        (answer.status == StatusCode::SERVICE_UNAVAILABLE).then(|| {
            answer.body["detail"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
    })
    .await;
    assert!(detail.contains("'volatile-lru'"), "{detail}");
    app.consume("sms", "u-1", 1).await.assert_problem(503);
    let metrics = app.metrics_text().await;
    for line in [
        "quota_redis_maxmemory_policy{policy=\"volatile-lru\"} 1\n",
        "quota_redis_maxmemory_bytes 67108864\n",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(metrics.contains("quota_redis_used_memory_bytes "));
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);

    set_policy(&redis, "noeviction").await;
    eventually(
        Duration::from_secs(15),
        "consumes are served again",
        || async { (app.consume("sms", "u-1", 1).await.status == StatusCode::OK).then_some(()) },
    )
    .await;
}
