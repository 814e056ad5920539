//! Under concurrency the limit holds exactly, on one instance and across two sharing Redis
//! (standalone or Cluster); and one consume costs Redis exactly one command.

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_app, spawn_with, CounterBackend, PolicyBackend,
    PrivateRedis, TestApp,
};
use reqwest::StatusCode;
use serde_json::json;
use tokio::task::JoinSet;

/// Fires `total` consumes at once, spread round-robin over `apps`; counts the 200s.
async fn burst(apps: &[&TestApp], total: usize) -> usize {
    let mut tasks = JoinSet::new();
    for i in 0..total {
        let app = apps[i % apps.len()];
        let request = app
            .client
            .post(format!("{}/quota/consume", app.address))
            .json(&json!({"action": "sms.send", "subject": "user-42"}));
        tasks.spawn(async move { request.send().await.map(|r| r.status()) });
    }
    let mut allowed = 0;
    while let Some(result) = tasks.join_next().await {
        let status = result.expect("task ran").expect("request answered");
        match status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    allowed
}

#[tokio::test]
async fn three_hundred_concurrent_consumes_allow_exactly_the_limit_in_memory() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p", "sms.send", 100, "day", "UTC"))
        .await;
    assert_eq!(burst(&[&app], 300).await, 100);
}

#[tokio::test]
async fn three_hundred_concurrent_consumes_allow_exactly_the_limit_on_redis() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    app.must_create_policy(calendar_policy("p", "sms.send", 100, "day", "UTC"))
        .await;
    assert_eq!(burst(&[&app], 300).await, 100);
    // Every decision was sent to Redis once, alone or batched with others.
    let metrics = app.metrics_text().await;
    let sample = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(sample("quota_redis_decisions_total"), 300);
    let calls = sample("quota_redis_decision_calls_total");
    assert!((1..=300).contains(&calls), "{calls} calls");
}

#[tokio::test]
async fn three_hundred_concurrent_consumes_allow_exactly_the_limit_on_the_cluster() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Cluster).await;
    app.must_create_policy(calendar_policy("p", "sms.send", 100, "day", "UTC"))
        .await;
    assert_eq!(burst(&[&app], 300).await, 100);
}

/// Two instances with the same policy database and counter store (and key prefix) split a
/// burst of 300 between them: together they allow exactly the limit of 100.
async fn two_instances_allow_exactly_the_limit_together(counters: CounterBackend) {
    let first = spawn_app(PolicyBackend::Postgres, counters).await;
    let rolling = json!({"id": "p", "action": "sms.send", "measure": "count", "limit": 100,
        "window": {"type": "rolling", "seconds": 3600, "bucket_seconds": 60}});
    first.must_create_policy(rolling).await;
    let second = spawn_with(first.settings.clone()).await;
    assert_eq!(burst(&[&first, &second], 300).await, 100);
    let usage = second.usage("sms.send", "user-42").await;
    assert_eq!(usage.body["policies"][0]["used"], 100);
}

#[tokio::test]
async fn two_instances_sharing_redis_allow_exactly_the_limit_together() {
    two_instances_allow_exactly_the_limit_together(CounterBackend::Redis).await;
}

#[tokio::test]
async fn two_instances_sharing_the_cluster_allow_exactly_the_limit_together() {
    two_instances_allow_exactly_the_limit_together(CounterBackend::Cluster).await;
}

/// Watches every command Redis receives (MONITOR) until `ECHO <marker>` arrives; returns
/// the command names sent by clients, leaving out those a Lua script ran.
async fn client_commands_until(url: &str, marker: &str) -> tokio::task::JoinHandle<Vec<String>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let address = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connecting to Redis");
    stream
        .write_all(b"MONITOR\r\n")
        .await
        .expect("sending MONITOR");
    let mut lines = BufReader::new(stream).lines();
    let ok = lines.next_line().await.expect("reading").expect("a reply");
    assert_eq!(ok, "+OK");
    let marker = format!("\"{marker}\"");
    tokio::spawn(async move {
        let mut commands = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(&marker) {
                break;
            }
            // `+<time> [<db> <client>] "<command>" ...`; script calls show `lua` as the client.
            let Some((client, rest)) = line.split_once("] ") else {
                continue;
            };
            if client.ends_with(" lua") {
                continue;
            }
            commands.push(rest.split('"').nth(1).unwrap_or("").to_lowercase());
        }
        commands
    })
}

#[tokio::test]
async fn one_consume_is_one_redis_command_whatever_the_number_of_policies() {
    let redis = PrivateRedis::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![redis.url.clone()];
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy(
        "daily",
        "sms.send",
        1000,
        "day",
        "Europe/Berlin",
    ))
    .await;
    app.must_create_policy(
        json!({"id": "rolling", "action": "sms.send", "measure": "count", "limit": 1000,
        "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600}}),
    )
    .await;
    app.must_create_policy(
        json!({"id": "bucket", "action": "sms.send", "measure": "amount", "limit": 1000,
        "window": {"type": "token_bucket", "seconds": 60}}),
    )
    .await;
    assert_eq!(
        app.consume("sms.send", "warm-up", 1).await.status,
        StatusCode::OK
    );

    let watcher = client_commands_until(&redis.url, "end-of-test").await;
    const N: usize = 50;
    for i in 0..N {
        let answer = app.consume("sms.send", &format!("user-{i}"), 1).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let mut conn = redis.connection().await;
    let _: String = redis::cmd("ECHO")
        .arg("end-of-test")
        .query_async(&mut conn)
        .await
        .unwrap();
    let commands = watcher.await.expect("the monitor ran");
    // The ledger drain, the hold sweeper and the watch (the backlog's length, Redis's
    // memory settings, the shards' epochs) run in the background on their own schedule,
    // whatever the number of consumes: leave their commands out.
    let background = [
        "xreadgroup",
        "xautoclaim",
        "xack",
        "xdel",
        "xgroup",
        "zrangebyscore",
        "xlen",
        "info",
        "exists",
        // The janitor's lease, sent whole every few seconds.
        "eval",
        // The drain reads a shard's write generation after each batch it moves.
        "get",
        "zrange",
    ];
    let per_consume: Vec<&String> = commands
        .iter()
        .filter(|c| !background.contains(&c.as_str()))
        .collect();
    assert_eq!(
        per_consume.len(),
        N,
        "one command per consume: {per_consume:?}"
    );
    assert!(
        per_consume.iter().all(|c| *c == "evalsha"),
        "and it is EVALSHA: {per_consume:?}"
    );
}
