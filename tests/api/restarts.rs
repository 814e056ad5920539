//! The embedded default across restarts: usage, open holds and the answers kept for
//! retries are rebuilt from the SQL ledger before the first request is answered, so a
//! restart changes no answer.

mod histories;
mod snapshots;

use crate::helpers::{
    calendar_policy, eventually, fresh_settings, spawn_app, start_binary, Answer, CounterBackend,
    PolicyBackend, TestApp, ADMIN_TOKEN,
};
use crate::on_policy_stores;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

/// An app on the embedded counters with one action, `transfer`, limited three ways:
/// 3 a day (calendar, New York), 1,000 cents an hour (rolling), 5 a minute (token bucket).
async fn transfer_app(store: PolicyBackend) -> TestApp {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy(
        "daily",
        "transfer",
        3,
        "day",
        "America/New_York",
    ))
    .await;
    app.must_create_policy(json!({"id": "hourly-cents", "action": "transfer",
        "measure": "amount", "limit": 1000,
        "window": {"type": "rolling", "seconds": 3600, "bucket_seconds": 60}}))
        .await;
    app.must_create_policy(
        json!({"id": "per-minute", "action": "transfer", "measure": "count", "limit": 5,
        "window": {"type": "token_bucket", "seconds": 60}}),
    )
    .await;
    app
}

fn consume_body(amount: u64, key: Option<&str>) -> Value {
    let mut body = json!({"action": "transfer", "subject": "u-1", "amount": amount});
    if let Some(key) = key {
        body["idempotency_key"] = json!(key);
    }
    body
}

/// The usage answer's policies (what a restart must not change).
async fn usage(app: &TestApp) -> Value {
    let answer = app.usage("transfer", "u-1").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["policies"].clone()
}

/// The ledger's entries of `kind` for u-1.
async fn ledger_of(app: &TestApp, kind: &str) -> Vec<Value> {
    let answer = app
        .send(app.client.get(format!(
            "{}/quota/ledger?subject=u-1&kind={kind}",
            app.address
        )))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["items"].as_array().cloned().unwrap_or_default()
}

async fn usage_and_denials_are_the_same_after_a_restart(store: PolicyBackend) {
    let app = transfer_app(store).await;
    for amount in [100, 250, 300] {
        let answer = app
            .quota("/quota/consume", consume_body(amount, None))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        app.advance(7);
    }
    let fourth = app.quota("/quota/consume", consume_body(50, None)).await;
    assert_eq!(
        fourth.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        fourth.body
    );
    let before = usage(&app).await;

    let app = app.restart().await;
    assert_eq!(usage(&app).await, before, "usage survives the restart");
    let again = app.quota("/quota/consume", consume_body(50, None)).await;
    assert_eq!(
        again.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        again.body
    );
    assert_eq!(
        again.body["policies"], fourth.body["policies"],
        "the fourth is denied exactly as before"
    );
}

async fn a_retry_after_a_restart_replays_the_original_answer(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let first = app
        .quota("/quota/consume", consume_body(600, Some("pay-1")))
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    app.quota("/quota/consume", consume_body(100, None)).await;
    app.advance(30);

    let app = app.restart().await;
    let retry = app
        .quota("/quota/consume", consume_body(600, Some("pay-1")))
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    let mut expected = first.body.clone();
    expected["replayed"] = json!(true);
    assert_eq!(retry.body, expected, "the original answer, replayed");
    assert_eq!(ledger_of(&app, "charge").await.len(), 2, "charged once");
    app.quota("/quota/consume", consume_body(700, Some("pay-1")))
        .await
        .assert_problem(409);
}

/// Holds 800 cents of `transfer` for u-1 for `ttl_seconds`; returns the hold id.
async fn hold_800(app: &TestApp, ttl_seconds: u64) -> String {
    let body = json!({"action": "transfer", "subject": "u-1", "amount": 800,
        "ttl_seconds": ttl_seconds});
    let hold = app.quota("/quota/holds", body).await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    hold.body["hold_id"].as_str().unwrap().to_owned()
}

async fn a_hold_opened_before_a_restart_is_settled_after_it(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let id = hold_800(&app, 600).await;
    app.advance(60);

    let app = app.restart().await;
    let commit = app
        .quota(&format!("/quota/holds/{id}/commit"), json!({"amount": 300}))
        .await;
    assert_eq!(commit.status, StatusCode::OK, "{}", commit.body);
    let cents = usage(&app).await;
    assert_eq!(cents[1]["policy_id"], "hourly-cents");
    assert_eq!(cents[1]["used"], 300, "the unsettled 500 went back");
    app.quota(&format!("/quota/holds/{id}/commit"), json!({}))
        .await
        .assert_problem(409);
}

async fn a_hold_that_expired_while_down_is_released_and_recorded_at_start(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let id = hold_800(&app, 60).await;
    // The service is down while the hold expires.
    let clock = app.clock.clone();
    let app = app
        .restart_at(|| clock.advance(chrono::Duration::seconds(120)))
        .await;
    let expired = ledger_of(&app, "expire").await;
    assert_eq!(expired.len(), 1, "recorded at start: {expired:?}");
    assert_eq!(expired[0]["hold_id"], id.as_str());
    assert_eq!(usage(&app).await[1]["used"], 0, "released");
    app.quota(&format!("/quota/holds/{id}/commit"), json!({}))
        .await
        .assert_problem(409);
}

async fn a_refund_after_a_restart_gives_back_what_is_left(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let charge = app.quota("/quota/consume", consume_body(600, None)).await;
    let id = charge.body["consumption_id"].clone();
    let partial = refund(&app, &id, Some(100)).await;
    assert_eq!(partial.status, StatusCode::OK, "{}", partial.body);

    let app = app.restart().await;
    assert_eq!(usage(&app).await[1]["used"], 500);
    refund(&app, &id, Some(600)).await.assert_problem(409);
    let rest = refund(&app, &id, None).await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    assert_eq!(rest.body["entry"]["amount"], 500);
    assert_eq!(usage(&app).await[1]["used"], 0);
}

/// Refunds `amount` (default: all that is left) of the consumption `id`.
async fn refund(app: &TestApp, id: &Value, amount: Option<u64>) -> Answer {
    let mut body = json!({"consumption_id": id});
    if let Some(amount) = amount {
        body["amount"] = json!(amount);
    }
    app.quota("/quota/refund", body).await
}

/// A refund made before the rebuild's horizon (38 days) still counts: after a restart, a
/// consume is never refunded for more than it charged.
async fn refunds_older_than_the_horizon_still_cap_later_refunds(store: PolicyBackend) {
    let app = transfer_app(store).await;
    let charge = app.quota("/quota/consume", consume_body(600, None)).await;
    let id = charge.body["consumption_id"].clone();
    let day = 86_400;
    app.advance(day);
    let first = refund(&app, &id, Some(300)).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    app.advance(29 * day);
    let second = refund(&app, &id, Some(200)).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    app.advance(10 * day);

    let app = app.restart().await;
    refund(&app, &id, Some(200)).await.assert_problem(409);
    let rest = refund(&app, &id, None).await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    assert_eq!(rest.body["entry"]["amount"], 100);
}

on_policy_stores!(
    usage_and_denials_are_the_same_after_a_restart,
    refunds_older_than_the_horizon_still_cap_later_refunds,
    a_retry_after_a_restart_replays_the_original_answer,
    a_hold_opened_before_a_restart_is_settled_after_it,
    a_hold_that_expired_while_down_is_released_and_recorded_at_start,
    a_refund_after_a_restart_gives_back_what_is_left,
);

/// The real binary on the embedded default, stopped with SIGTERM or killed with kill -9
/// after three SMS of a 3-a-day policy: the fourth is still refused after the restart.
async fn the_fourth_sms_is_refused_after_the_binary_restarts(kill: bool) {
    let settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (service, base) = start_binary(&settings, &client).await;
    let created = client
        .post(format!("{base}/admin/policies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&calendar_policy("sms-daily", "sms.send", 3, "day", "UTC"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let consume = || async {
        let response = client
            .post(format!("{base}/quota/consume"))
            .json(&json!({"action": "sms.send", "subject": "u-1"}))
            .send()
            .await
            .unwrap();
        Answer::read(response).await
    };
    for _ in 0..3 {
        assert_eq!(consume().await.status, StatusCode::OK);
    }
    assert_eq!(consume().await.status, StatusCode::TOO_MANY_REQUESTS);
    match kill {
        true => {
            let mut service = service;
            service.kill_9();
        }
        false => assert!(service.terminate().await.success()),
    }

    let (mut service, base) = start_binary(&settings, &client).await;
    let answer = eventually(Duration::from_secs(5), "an answer", || async {
        let response = client
            .post(format!("{base}/quota/consume"))
            .json(&json!({"action": "sms.send", "subject": "u-1"}))
            .send()
            .await
            .ok()?;
        Some(Answer::read(response).await)
    })
    .await;
    service.kill_9();
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.body
    );
    assert_eq!(answer.body["policies"][0]["used"], 3);
}

#[tokio::test]
async fn the_fourth_sms_is_refused_after_a_sigterm_restart() {
    the_fourth_sms_is_refused_after_the_binary_restarts(false).await;
}

#[tokio::test]
async fn the_fourth_sms_is_refused_after_a_kill_9_restart() {
    the_fourth_sms_is_refused_after_the_binary_restarts(true).await;
}
