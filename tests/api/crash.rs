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
