//! Every change whose ledger entry cannot be committed is answered 503 and undone: a
//! consume (keyed or not), a hold, a refund, a hold's commit, release and expiry. After
//! recovery, usage equals what was answered allowed, a keyed retry is decided afresh,
//! and a restart finds the same.

use super::refusal::{ledger_rows, Refusal, WriteLock};
use super::{assert_no_drift, cli_verify};
use crate::helpers::{spawn_app, Answer, CounterBackend, PolicyBackend, TestApp};
use crate::on_policy_stores;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn dollars(limit: u64) -> Value {
    json!({"id": "dollars", "action": "transfer", "measure": "amount", "limit": limit,
        "window": {"type": "calendar", "period": "day"}})
}

async fn used(app: &TestApp) -> u64 {
    let usage = app.usage("transfer", "u").await;
    usage.body["policies"][0]["used"].as_u64().unwrap()
}

async fn transfer(app: &TestApp, amount: u64, key: Option<&str>) -> Answer {
    let mut body = json!({"action": "transfer", "subject": "u", "amount": amount});
    if let Some(key) = key {
        body["idempotency_key"] = json!(key);
    }
    app.quota("/quota/consume", body).await
}

async fn hold(app: &TestApp, amount: u64, ttl_seconds: u64) -> Answer {
    app.quota(
        "/quota/holds",
        json!({"action": "transfer", "subject": "u", "amount": amount, "ttl_seconds": ttl_seconds}),
    )
    .await
}

/// Asserts the answer is the ledger's 503: it says which store, and when to retry.
fn assert_ledger_refused(answer: &Answer) {
    let problem = answer.assert_problem(503);
    assert_eq!(
        problem["type"], "urn:quota-ledger:problem:ledger-unavailable",
        "{problem}"
    );
    assert!(answer.header("retry-after").is_some());
}

async fn a_consume_the_ledger_refuses_is_answered_503_and_leaves_nothing_behind(
    policy: PolicyBackend,
) {
    let app = spawn_app(policy, CounterBackend::Memory).await;
    app.must_create_policy(dollars(100_000)).await;
    let url = app.settings.database_url.clone();
    assert_eq!(transfer(&app, 10_000, None).await.status, StatusCode::OK);

    let refusal = Refusal::install(&url).await;
    for _ in 0..3 {
        assert_ledger_refused(&transfer(&app, 30_000, None).await);
    }
    assert_ledger_refused(&transfer(&app, 60_000, Some("pay-1")).await);
    assert_ledger_refused(&hold(&app, 5_000, 600).await);
    assert_eq!(used(&app).await, 10_000, "no refused request was charged");
    // Nothing was kept for the key either: a retry during the fault is refused again.
    assert_ledger_refused(&transfer(&app, 60_000, Some("pay-1")).await);
    refusal.lift().await;

    let retry = transfer(&app, 60_000, Some("pay-1")).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["replayed"], false, "decided afresh");
    assert_eq!(used(&app).await, 70_000);
    let again = transfer(&app, 60_000, Some("pay-1")).await;
    assert_eq!(again.body["replayed"], true, "now it is kept");
    assert_eq!(
        again.body["consumption_id"], retry.body["consumption_id"],
        "the answer kept is the committed one"
    );
    let ledger = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?subject=u", app.address)),
        )
        .await;
    let items = ledger.body["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2, "one entry per allowed answer: {items:?}");
    assert!(items
        .iter()
        .any(|e| e["consumption_id"] == retry.body["consumption_id"]));

    // The graceful stop's snapshot holds what the ledger holds, and so does a kill -9.
    let app = app.restart().await;
    assert_eq!(used(&app).await, 70_000);
    assert_no_drift(&app).await;
    let app = app.crash_restart().await;
    assert_eq!(used(&app).await, 70_000);
    assert_eq!(ledger_rows(&url).await, 2);
    assert_eq!(cli_verify(&app).await.0, 0);
}

async fn a_settlement_the_ledger_refuses_changes_nothing(policy: PolicyBackend) {
    let app = spawn_app(policy, CounterBackend::Memory).await;
    app.must_create_policy(dollars(100_000)).await;
    let url = app.settings.database_url.clone();
    let charge = transfer(&app, 50_000, None).await;
    let consumption = charge.body["consumption_id"].as_str().unwrap().to_owned();
    let hold_id = |answer: Answer| answer.body["hold_id"].as_str().unwrap().to_owned();
    let (a, b) = (
        hold_id(hold(&app, 20_000, 600).await),
        hold_id(hold(&app, 10_000, 600).await),
    );
    let c = hold_id(hold(&app, 5_000, 60).await);
    assert_eq!(used(&app).await, 85_000);

    let refusal = Refusal::install(&url).await;
    let refund = json!({"consumption_id": consumption, "amount": 20_000});
    assert_ledger_refused(&app.quota("/quota/refund", refund.clone()).await);
    let release = format!("/quota/holds/{a}/release");
    assert_ledger_refused(&app.quota(&release, json!({})).await);
    let commit = format!("/quota/holds/{b}/commit");
    assert_ledger_refused(&app.quota(&commit, json!({"amount": 4_000})).await);
    app.advance(120);
    assert_eq!(
        app.engine.expire_due_holds().await,
        0,
        "an expiry the ledger refuses is not done"
    );
    assert_eq!(used(&app).await, 85_000, "nothing was given back");
    refusal.lift().await;

    let refunded = app.quota("/quota/refund", refund).await;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.body);
    let released = app.quota(&release, json!({})).await;
    assert_eq!(
        released.status,
        StatusCode::OK,
        "still open: {}",
        released.body
    );
    let committed = app.quota(&commit, json!({"amount": 4_000})).await;
    assert_eq!(committed.status, StatusCode::OK, "{}", committed.body);
    assert_eq!(app.engine.expire_due_holds().await, 1, "{c} expires now");
    assert_eq!(used(&app).await, 85_000 - 20_000 - 20_000 - 6_000 - 5_000);
    assert_eq!(
        ledger_rows(&url).await,
        8,
        "charge, 3 holds, and 4 settlements"
    );
    assert_no_drift(&app).await;
    let app = app.crash_restart().await;
    assert_eq!(used(&app).await, 34_000);
    assert_eq!(cli_verify(&app).await.0, 0);
}

on_policy_stores!(
    a_consume_the_ledger_refuses_is_answered_503_and_leaves_nothing_behind,
    a_settlement_the_ledger_refuses_changes_nothing,
);

/// While a keyed consume's entry waits to commit (another connection holds SQLite's write
/// lock), a retry with the same key waits for its outcome: the first answer, replayed, once
/// it is committed; a fresh decision once it was refused and undone. Never a replay of an
/// answer that is then undone.
#[tokio::test]
async fn a_retry_while_the_first_attempts_entry_commits_waits_for_its_outcome() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(dollars(100_000)).await;
    let url = app.settings.database_url.clone();
    let send = |key: &str| {
        let request = app
            .client
            .post(format!("{}/quota/consume", app.address))
            .json(&json!({"action": "transfer", "subject": "u", "amount": 600,
                "idempotency_key": key}));
        tokio::spawn(async move { Answer::read(request.send().await.unwrap()).await })
    };

    // Committed: the retry replays the first answer.
    let lock = WriteLock::take(&url).await;
    let first = send("pay-1");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let retry = send("pay-1");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    lock.release().await;
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(retry.body["replayed"], true, "{}", retry.body);
    assert_eq!(retry.body["consumption_id"], first.body["consumption_id"]);
    assert_eq!(used(&app).await, 600);

    // Refused (the lock outlives SQLite's busy timeout): the retry is decided afresh.
    let lock = WriteLock::take(&url).await;
    let first = send("pay-2");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let retry = send("pay-2");
    let first = first.await.unwrap();
    assert_ledger_refused(&first);
    lock.release().await;
    let retry = retry.await.unwrap();
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(
        retry.body["replayed"], false,
        "decided afresh: {}",
        retry.body
    );
    assert_eq!(used(&app).await, 1_200, "charged once");
    assert_no_drift(&app).await;
}
