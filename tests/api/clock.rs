//! One clock: with Redis, instances whose clocks disagree decide by Redis's time. Two real
//! binaries share one Redis and one ledger, one of them under libfaketime 300 s ahead or
//! behind: a minute budget admits exactly its limit across both, nothing is answered 503
//! for the clock, and the offset shows in the metric, the log and `/readyz`.

use crate::helpers::{
    calendar_policy, eventually, free_port, fresh_settings, CounterBackend, PolicyBackend,
    PrivateRedis, Service, ADMIN_TOKEN,
};
use quota_ledger::config::Settings;
use serde_json::{json, Value};
use std::time::Duration;

/// The binary on `settings`' stores, its clock moved by `skew` (libfaketime's `-f`
/// offset, e.g. `+300s`) when given; its log (standard output) goes to `log`. Returns it with its base URL.
async fn start(
    settings: &Settings,
    skew: Option<&str>,
    log: &std::path::Path,
    client: &reqwest::Client,
) -> (Service, String) {
    start_on(settings, skew, log, client, false).await
}

/// [`start`], on a Redis Cluster with `cluster`.
async fn start_on(
    settings: &Settings,
    skew: Option<&str>,
    log: &std::path::Path,
    client: &reqwest::Client,
    cluster: bool,
) -> (Service, String) {
    let binary = env!("CARGO_BIN_EXE_quota-ledger");
    let mut command = match skew {
        Some(offset) => {
            let mut faked = std::process::Command::new("faketime");
            faked.args(["-f", offset, binary]);
            faked
        }
        None => std::process::Command::new(binary),
    };
    let port = free_port();
    command
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("QUOTA_LISTEN", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", &settings.database_url)
        .env("REDIS_URL", &settings.redis_urls[0])
        .env("REDIS_CLUSTER", cluster.to_string())
        .env("QUOTA_REDIS_PREFIX", &settings.redis_prefix)
        .env("QUOTA_REDIS_TIMEOUT_MS", "2000")
        .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(log).expect("creating the log file"))
        .stderr(std::process::Stdio::null());
    let service = Service::spawn(&mut command);
    let base = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(20), "the binary is ready", || async {
        let ready = client.get(format!("{base}/readyz")).send().await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    (service, base)
}

/// Redis's clock, in seconds since the epoch.
async fn redis_seconds(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let (seconds, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut connection)
        .await
        .unwrap();
    seconds
}

async fn json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn two_instances_one_skewed(skew: &str, expected_offset: f64) {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Redis).await;
    let client = reqwest::Client::new();
    let dir = std::env::temp_dir().join(format!(
        "quota-ledger-clock-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (_plain, plain) = start(&settings, None, &dir.join("plain.log"), &client).await;
    let (_skewed, skewed) = start(&settings, Some(skew), &dir.join("skewed.log"), &client).await;

    let policy = calendar_policy("clock-minute", "clock.send", 5, "minute", "UTC");
    let created = client
        .post(format!("{plain}/admin/policies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let body = json!({"action": "clock.send", "subject": "u-1"});
    eventually(
        Duration::from_secs(10),
        "the skewed instance knows the policy",
        || async {
            let checked = client
                .post(format!("{skewed}/quota/check"))
                .json(&body)
                .send()
                .await
                .ok()?;
            (checked.status().as_u16() == 200).then_some(())
        },
    )
    .await;

    // Ten consumes, alternating, inside one minute of Redis's clock.
    while redis_seconds(&settings.redis_urls[0]).await % 60 > 40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut statuses = Vec::new();
    for round in 0..10 {
        let base = if round % 2 == 0 { &plain } else { &skewed };
        let answer = client
            .post(format!("{base}/quota/consume"))
            .json(&body)
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
    }
    let allowed = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(
        allowed, 5,
        "a minute budget of 5 across both instances: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "no 503 for the clock: {statuses:?}"
    );

    // The skewed instance stamps its entries by Redis's clock.
    let (_, ledger) = json(
        client
            .get(format!("{skewed}/quota/ledger?action=clock.send"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let now = redis_seconds(&settings.redis_urls[0]).await as i64;
    for entry in ledger["items"].as_array().unwrap() {
        let at = chrono::DateTime::parse_from_rfc3339(entry["at"].as_str().unwrap()).unwrap();
        assert!(
            (now - at.timestamp()).abs() < 30,
            "stamped by Redis's clock: {entry}"
        );
    }

    // The offset, in the metric, in /readyz's body (ready all the same), and in the log.
    let metrics = client
        .get(format!("{skewed}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let offset: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("quota_clock_offset_seconds "))
        .expect("the offset is exported")
        .parse()
        .unwrap();
    assert!((offset - expected_offset).abs() < 2.0, "offset {offset}");
    let (status, ready) = json(client.get(format!("{skewed}/readyz")).send().await.unwrap()).await;
    assert_eq!(status, 200, "{ready}");
    assert!((ready["clock_offset_seconds"].as_f64().unwrap() - expected_offset).abs() < 2.0);
    assert!(
        ready["warnings"][0]
            .as_str()
            .unwrap()
            .contains("QUOTA_MAX_CLOCK_OFFSET_MS"),
        "{ready}"
    );
    let (_, ready) = json(client.get(format!("{plain}/readyz")).send().await.unwrap()).await;
    assert_eq!(ready["warnings"], json!([]), "{ready}");
    let log = dir.join("skewed.log");
    eventually(
        Duration::from_secs(5),
        "the skewed instance warns",
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("differs from Redis's").then_some(())
        },
    )
    .await;

    let (status, verified) = json(
        client
            .get(format!("{plain}/admin/counters/verify"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["drift"], json!([]), "{verified}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_instance_300_s_ahead_decides_by_redis_time() {
    two_instances_one_skewed("+300s", -300.0).await;
}

#[tokio::test]
async fn an_instance_300_s_behind_decides_by_redis_time() {
    two_instances_one_skewed("-300s", 300.0).await;
}

/// On a Redis Cluster each primary keeps its own clock: with one of two primaries 300 s
/// ahead (`clock_shift.c`), the call deadlines its scripts check are computed from that
/// node's own offset, so consumes on its slots are decided rather than refused as late, and
/// the counters equal the ledger.
#[tokio::test]
async fn on_a_cluster_a_primary_whose_clock_is_ahead_decides_on_time() {
    // Shard 0 (hash tag `0`, slot 13907) is on the second node, whose clock the engine
    // follows; the first node's clock runs ahead of it, so that a deadline computed from
    // the engine's clock has passed on that node before the call arrives.
    let nodes = PrivateRedis::start_cluster_of(&[Some(300), None]).await;
    let mut settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    settings.redis_urls = vec![nodes[0].url.clone()];
    let client = reqwest::Client::new();
    let log = std::env::temp_dir().join(format!(
        "quota-ledger-node-clock-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let (_service, base) = start_on(&settings, None, &log, &client, true).await;
    let policy = calendar_policy("node-day", "node.send", 1_000, "day", "UTC");
    let created = client
        .post(format!("{base}/admin/policies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    // Every node's offset is measured within a second or two of the start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut refused = Vec::new();
    for n in 0..40 {
        let body = json!({"action": "node.send", "subject": format!("s-{n}")});
        let answer = client
            .post(format!("{base}/quota/consume"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, body) = json(answer).await;
        if status != 200 {
            refused.push(format!("s-{n}: {status} {body}"));
        }
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
    let skewed = nodes[0].cli(None, &["DBSIZE"]);
    assert_ne!(skewed.trim(), "0", "some subjects live on the skewed node");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("primaries differ by more than QUOTA_MAX_CLOCK_OFFSET_MS"),
        "the skew is logged: {logged}"
    );
    let (status, verified) = json(
        client
            .get(format!("{base}/admin/counters/verify"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["drift"], json!([]), "{verified}");
}
