//! kill -9 during a burst of consumes, restart: every consumption a client saw allowed is
//! in the Postgres ledger exactly once.

use crate::helpers::{
    create_sms_policy, eventually, fresh_settings, start_binary, CounterBackend, PolicyBackend,
};
use serde_json::json;
use std::time::Duration;
use tokio::task::JoinSet;

#[tokio::test]
async fn kill_9_during_a_burst_loses_no_ledger_entry_and_duplicates_none() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Redis).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    for round in 0..2 {
        let (mut child, base) = start_binary(&settings, &client).await;
        if round == 0 {
            create_sms_policy(&client, &base).await;
        }
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        for i in 0..600u64 {
            let request = client
                .post(format!("{base}/quota/consume"))
                .json(&json!({"action": "sms.send", "subject": format!("user-{}", i % 50)}));
            let answered = answered.clone();
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_micros(i * 400)).await;
                let response = request.send().await.ok()?;
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body: serde_json::Value = response.json().await.ok()?;
                (body["allowed"] == true)
                    .then(|| body["consumption_id"].as_str().map(str::to_owned))?
            });
        }
        eventually(
            Duration::from_secs(10),
            "150 answers to the burst",
            || async { (answered.load(std::sync::atomic::Ordering::SeqCst) >= 150).then_some(()) },
        )
        .await;
        child.kill_9();
        while let Some(result) = tasks.join_next().await {
            if let Some(id) = result.unwrap() {
                seen.push(id);
            }
        }
        assert!(
            seen.len() >= 100,
            "round {round}: a burst was answered before the kill"
        );
    }

    // Restart: the new instance claims what the dead ones read but never acknowledged.
    let (mut child, _) = start_binary(&settings, &client).await;
    let db = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let rows = eventually(
        Duration::from_secs(10),
        "every consumption a client saw allowed is in the ledger",
        || async {
            let (found, rows): (i64, i64) = sqlx::query_as(
                "SELECT count(DISTINCT consumption_id), count(*) FROM ledger_entries \
                 WHERE kind = 'charge' AND consumption_id = ANY($1)",
            )
            .bind(&seen)
            .fetch_one(&db)
            .await
            .unwrap();
            (found == seen.len() as i64).then_some(rows)
        },
    )
    .await;
    child.kill_9();
    assert_eq!(rows, seen.len() as i64, "exactly once");
}

/// A ledger row as the cluster crash test reads it: subject, attributes, +1 or -1.
type Row = (String, Option<String>, i64);

/// kill -9 during a burst of consumes across Redis Cluster slots (each charges its subject,
/// its country and the platform: three slots), a third of them refunded at once, restart:
/// once the sweeper's window has passed, every budget's usage equals what the ledger says
/// was charged to it, less what it says was refunded.
#[tokio::test]
async fn kill_9_during_a_burst_across_cluster_slots_leaves_usage_equal_to_the_ledger() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Cluster).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (mut child, base) = start_binary(&settings, &client).await;
    let day = json!({"type": "calendar", "period": "day"});
    for (id, scope) in [
        ("per-user", json!(["subject"])),
        ("per-country", json!(["country"])),
        ("platform", json!([])),
    ] {
        let created = client
            .post(format!("{base}/admin/policies"))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(
                &json!({"id": id, "action": "sms", "measure": "count", "limit": 1_000_000,
                "scope": scope, "window": day}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    }
    let countries = ["NG", "GH", "KE", "ZA", "EG"];
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for i in 0..600u64 {
        let body = json!({"action": "sms", "subject": format!("user-{}", i % 50),
            "attributes": {"country": countries[(i % 5) as usize]}});
        let request = client.post(format!("{base}/quota/consume")).json(&body);
        let refund = client.post(format!("{base}/quota/refund"));
        let answered = answered.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_micros(i * 400)).await;
            let response = request.send().await.ok()?;
            answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body: serde_json::Value = response.json().await.ok()?;
            if i % 3 == 0 {
                let id = body["consumption_id"].as_str()?;
                refund
                    .json(&json!({"consumption_id": id}))
                    .send()
                    .await
                    .ok()?;
            }
            Some(())
        });
    }
    eventually(
        Duration::from_secs(15),
        "150 answers to the burst",
        || async { (answered.load(std::sync::atomic::Ordering::SeqCst) >= 150).then_some(()) },
    )
    .await;
    child.kill_9();
    while tasks.join_next().await.is_some() {}

    // Restart: the drain moves what the streams hold, the sweeper abandons what the dead
    // instance left half done (deadline 5 s + skew 5 s).
    let (mut child, base) = start_binary(&settings, &client).await;
    let db = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let usage = |subject: String, country: &'static str| {
        let request = client.get(format!("{base}/quota/usage")).query(&[
            ("action", "sms"),
            ("subject", subject.as_str()),
            ("attributes[country]", country),
        ]);
        async move {
            let body: serde_json::Value = request.send().await.ok()?.json().await.ok()?;
            let used = |id: &str| {
                body["policies"]
                    .as_array()?
                    .iter()
                    .find(|p| p["policy_id"] == id)?["used"]
                    .as_i64()
            };
            Some((used("per-user")?, used("per-country")?, used("platform")?))
        }
    };
    eventually(
        Duration::from_secs(45),
        "every budget's usage is the ledger's",
        || async {
            // A charge counts 1 on each budget, a (whole) refund -1.
            let rows: Vec<Row> = sqlx::query_as(
                "SELECT subject, attributes->>'country', \
                 (CASE kind WHEN 'charge' THEN 1 ELSE -1 END)::BIGINT \
                 FROM ledger_entries WHERE kind IN ('charge', 'refund')",
            )
            .fetch_all(&db)
            .await
            .unwrap();
            let country_of = |country: &Option<String>| country.clone().unwrap_or_default();
            for (i, country) in countries.iter().enumerate() {
                let subject = format!("user-{i}");
                let (user, per_country, platform) = usage(subject.clone(), country).await?;
                let sum = |keep: &dyn Fn(&Row) -> bool| {
                    rows.iter().filter(|r| keep(r)).map(|r| r.2).sum::<i64>()
                };
                let expected_user = sum(&|r| r.0 == subject);
                let expected_country = sum(&|r| country_of(&r.1) == *country);
                if (user, per_country, platform)
                    != (expected_user, expected_country, sum(&|_| true))
                {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    child.kill_9();
}

/// `name`'s value in `base`'s `/metrics`, if it has one.
async fn gauge(client: &reqwest::Client, base: &str, name: &str) -> Option<i64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Entries in the ledger streams of `prefix`, and how many of them were read by a drain and
/// not acknowledged.
async fn stream_entries(redis_url: &str, prefix: &str) -> (u64, u64) {
    let mut conn = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (mut length, mut pending) = (0, 0);
    for shard in 0..quota_ledger::keys::SHARDS {
        let stream = quota_ledger::keys::ledger_stream(prefix, shard);
        let len: u64 = redis::cmd("XLEN")
            .arg(&stream)
            .query_async(&mut conn)
            .await
            .unwrap();
        length += len;
        if len > 0 {
            let summary: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
                .arg(&stream)
                .arg("ledger")
                .query_async(&mut conn)
                .await
                .unwrap();
            pending += summary.0;
        }
    }
    (length, pending)
}

/// Two instances on one Redis; the first is the janitor. While the SQL ledger refuses
/// inserts (its table locked), the first appends entries and its drain reads some of them;
/// kill -9 it and unlock: the second takes the janitor's lease within its time to live,
/// and moves every entry the first left (read and unacknowledged, or never read) into
/// SQL, each once.
#[tokio::test]
async fn when_the_janitor_is_killed_another_instance_takes_over_and_loses_nothing() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Redis).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (mut first, first_base) = start_binary(&settings, &client).await;
    eventually(
        Duration::from_secs(5),
        "the first instance is the janitor",
        || async { (gauge(&client, &first_base, "quota_janitor").await == Some(1)).then_some(()) },
    )
    .await;
    let (mut second, second_base) = start_binary(&settings, &client).await;
    assert_eq!(
        gauge(&client, &second_base, "quota_janitor").await,
        Some(0),
        "one janitor at a time"
    );
    create_sms_policy(&client, &first_base).await;

    // Inserts wait for the lock; reads (and the policies) go on.
    let db = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let mut lock = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE ledger_entries IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    for i in 0..200 {
        let answer: serde_json::Value = client
            .post(format!("{first_base}/quota/consume"))
            .json(&json!({"action": "sms.send", "subject": format!("user-{}", i % 40)}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["allowed"], true, "{answer}");
        seen.push(answer["consumption_id"].as_str().unwrap().to_owned());
        if i == 100 {
            // Let the first drain read what it has, and wait on the lock.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let redis_url = &settings.redis_urls[0];
    let (length, pending) = eventually(
        Duration::from_secs(5),
        "the first drain has read entries it cannot insert",
        || async {
            let (length, pending) = stream_entries(redis_url, &settings.redis_prefix).await;
            (pending > 0).then_some((length, pending))
        },
    )
    .await;
    assert_eq!(length, 200, "nothing is in SQL yet");
    first.kill_9();
    lock.rollback().await.unwrap();

    eventually(
        Duration::from_secs(5),
        "the second instance becomes the janitor",
        || async { (gauge(&client, &second_base, "quota_janitor").await == Some(1)).then_some(()) },
    )
    .await;
    let rows = eventually(
        Duration::from_secs(15),
        "every consumption the first instance allowed is in the ledger",
        || async {
            let (found, rows): (i64, i64) = sqlx::query_as(
                "SELECT count(DISTINCT consumption_id), count(*) FROM ledger_entries \
                 WHERE kind = 'charge' AND consumption_id = ANY($1)",
            )
            .bind(&seen)
            .fetch_one(&db)
            .await
            .unwrap();
            (found == seen.len() as i64).then_some(rows)
        },
    )
    .await;
    assert_eq!(rows, seen.len() as i64, "each once");
    // Acknowledged (and deleted) right after their commit: shortly after they are in SQL.
    eventually(
        Duration::from_secs(5),
        &format!("the streams are empty ({pending} were read by the dead drain)"),
        || async {
            let (left, _) = stream_entries(redis_url, &settings.redis_prefix).await;
            (left == 0).then_some(())
        },
    )
    .await;
    second.kill_9();
}
