//! SIGTERM under load: the real binary stops accepting, finishes what it accepted, exits 0,
//! and every charge it made was answered.

use crate::helpers::{
    create_sms_policy, eventually, fresh_settings, spawn_with, start_binary, CounterBackend,
    PolicyBackend,
};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;
use tokio::task::JoinSet;

#[tokio::test]
async fn sigterm_under_load_loses_no_accepted_request() {
    let settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (child, base) = start_binary(&settings, &client).await;
    create_sms_policy(&client, &base).await;

    // A stream of requests over ~0.5 s; SIGTERM once 100 of them have been answered.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for i in 0..1_000u64 {
        let request = client
            .post(format!("{base}/quota/consume"))
            .json(&json!({"action": "sms.send", "subject": "user-42"}));
        let answered = answered.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_micros(i * 500)).await;
            let result = request.send().await.map(|r| r.status());
            answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            result
        });
    }
    eventually(
        Duration::from_secs(10),
        "100 answers to the stream",
        || async { (answered.load(std::sync::atomic::Ordering::SeqCst) >= 100).then_some(()) },
    )
    .await;
    let stopping = tokio::spawn(child.terminate());

    let mut answered_ok = 0;
    let mut refused = 0;
    while let Some(result) = tasks.join_next().await {
        match result.expect("task ran") {
            Ok(StatusCode::OK) => answered_ok += 1,
            Ok(other) => panic!("unexpected status {other}"),
            Err(_) => refused += 1,
        }
    }
    let status = stopping.await.expect("the binary stopped");
    assert!(status.success(), "a graceful stop exits 0: {status:?}");
    eprintln!("SIGTERM during a burst: {answered_ok} answered, {refused} not accepted");
    assert!(answered_ok > 0, "some requests were served before the stop");

    // Every charge the service made was answered: Redis holds exactly the 200s clients saw.
    let reader = spawn_with(settings).await;
    // The binary ran on the system clock: read the same calendar day it charged.
    reader.clock.set(chrono::Utc::now());
    let usage = reader.usage("sms.send", "user-42").await;
    assert_eq!(
        usage.body["policies"][0]["used"], answered_ok,
        "{answered_ok} answered, {refused} not accepted"
    );
}
