//! The ledger is the book of record on every path: a change whose entry cannot be
//! committed is answered 503 and leaves nothing behind, on the embedded default (memory
//! counters, SQLite or Postgres ledger), whatever the fault: the database refusing
//! writes, a full disk, the database stopped.

mod faults;
pub use refusal::Refusal;
mod histories;
mod real;
mod refusal;
mod stall;
mod verify;
mod voiding;

use crate::helpers::{TestApp, ADMIN_TOKEN};
use serde_json::Value;

/// `GET /admin/counters/verify`'s answer, asserted 200.
pub async fn verify(app: &TestApp) -> Value {
    let answer = app.admin_get("/admin/counters/verify").await;
    assert_eq!(answer.status, reqwest::StatusCode::OK, "{}", answer.body);
    answer.body
}

/// Asserts that every live budget agrees with the ledger, and that some were compared
/// (and, nothing being in flight, all).
pub async fn assert_no_drift(app: &TestApp) {
    let verified = verify(app).await;
    assert_eq!(verified["drift"], serde_json::json!([]), "{verified}");
    assert!(verified["checked"].as_u64().unwrap() > 0, "{verified}");
    assert_eq!(verified["not_compared"], 0, "{verified}");
}

/// `quota-ledger counters verify --url <app>`: its exit status and what it printed.
pub async fn cli_verify(app: &TestApp) -> (i32, String) {
    let url = app.address.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"))
            .args(["counters", "verify", "--url", &url])
            .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .expect("running quota-ledger counters verify")
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), printed)
}

/// The ledger's entries of `subject` once the streams are drained, oldest first, as
/// (kind, consumption or hold id).
pub async fn entries_of(app: &TestApp, subject: &str) -> Vec<(String, String)> {
    app.engine.drain_ledger_now().await;
    let path = format!("{}/quota/ledger?subject={subject}", app.address);
    let ledger = app.send(app.client.get(path)).await;
    let mut items: Vec<(String, String)> = ledger.body["items"]
        .as_array()
        .expect("a page of entries")
        .iter()
        .map(|e| {
            let id = e["consumption_id"].as_str().or(e["hold_id"].as_str());
            let kind = e["kind"].as_str().expect("a kind");
            (kind.to_owned(), id.unwrap_or("").to_owned())
        })
        .collect();
    items.reverse();
    items
}
