//! Over-capture: a hold settled for more than it held (the real cost is known only
//! afterwards, like the tokens an LLM call used). The excess is charged past the limit,
//! recorded in the commit entry, and survives restarts and rebuilds.

use crate::helpers::{spawn_app, spawn_with, Answer, CounterBackend, PolicyBackend, TestApp};
use crate::integrity::{assert_no_drift, cli_verify};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

const ACTION: &str = "llm.tokens";

/// 10,000 tokens a day (amount), and 100 calls a day (count).
async fn budgets(app: &TestApp) {
    let day = json!({"type": "calendar", "period": "day", "timezone": "UTC"});
    app.must_create_policy(
        json!({"id": "tokens", "action": ACTION, "measure": "amount",
        "limit": 10_000, "window": day}),
    )
    .await;
    app.must_create_policy(json!({"id": "calls", "action": ACTION, "measure": "count",
        "limit": 100, "window": day}))
        .await;
}

/// Each policy's `used` for `subject`, in id order.
async fn used(app: &TestApp, subject: &str) -> Vec<Value> {
    let usage = app.usage(ACTION, subject).await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    usage.body["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .map(|p| p["used"].clone())
        .collect()
}

async fn hold(app: &TestApp, subject: &str, amount: u64) -> String {
    let held = app
        .quota(
            "/quota/holds",
            json!({"action": ACTION, "subject": subject, "amount": amount, "ttl_seconds": 600}),
        )
        .await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    held.body["hold_id"].as_str().expect("a hold id").to_owned()
}

async fn commit(app: &TestApp, hold_id: &str, body: Value) -> Answer {
    app.quota(&format!("/quota/holds/{hold_id}/commit"), body)
        .await
}

/// The app's counters come back from the ledger: a crash restart (memory), or the loss
/// of every Redis key (Redis, the cluster).
async fn lose_counters(app: TestApp, counters: CounterBackend) -> TestApp {
    app.engine.drain_ledger_now().await;
    if counters == CounterBackend::Memory {
        return app.crash_restart().await;
    }
    let nodes = match counters {
        CounterBackend::Cluster => crate::helpers::cluster_urls(),
        _ => app.settings.redis_urls.clone(),
    };
    crate::redis_loss::lose_keys(&app, &nodes).await;
    for _ in 0..100 {
        if app.check(ACTION, "team-1", 1).await.status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    app
}

async fn an_over_capture_charges_the_excess_past_the_limit_until_a_refund(
    counters: CounterBackend,
) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    budgets(&app).await;
    let first = app.consume(ACTION, "team-1", 4_000).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let hold_id = hold(&app, "team-1", 2_000).await;

    // Without the flag, more than the hold is refused, and nothing changes.
    let refused = commit(&app, &hold_id, json!({"amount": 7_000})).await;
    refused.assert_problem(409);
    assert_eq!(used(&app, "team-1").await, vec![json!(1 + 1), json!(6_000)]);

    // With it, the excess (5,000) is charged past the limit and recorded.
    let committed = commit(
        &app,
        &hold_id,
        json!({"amount": 7_000, "over_capture": true}),
    )
    .await;
    assert_eq!(committed.status, StatusCode::OK, "{}", committed.body);
    let entry = &committed.body["entry"];
    assert_eq!(
        (&entry["kind"], &entry["amount"], &entry["over_captured"]),
        (&json!("commit"), &json!(7_000), &json!(true)),
        "{entry}"
    );
    assert_eq!(
        entry["policies"],
        json!([{"policy_id": "tokens", "amount": 5_000, "budget": {"subject": "team-1"}}]),
        "only the amount policy is charged the excess"
    );
    assert_eq!(used(&app, "team-1").await, vec![json!(2), json!(11_000)]);
    let denied = app.consume(ACTION, "team-1", 1).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
    let again = commit(
        &app,
        &hold_id,
        json!({"amount": 7_000, "over_capture": true}),
    )
    .await;
    again.assert_problem(409);

    // The counters come back from the ledger with the excess.
    let app = lose_counters(app, counters).await;
    assert_eq!(used(&app, "team-1").await, vec![json!(2), json!(11_000)]);
    let denied = app.consume(ACTION, "team-1", 1).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );

    // A refund brings usage back under the limit: consumes pass again.
    let refund = app
        .quota(
            "/quota/refund",
            json!({"consumption_id": first.body["consumption_id"]}),
        )
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    assert_eq!(used(&app, "team-1").await, vec![json!(1), json!(7_000)]);
    let allowed = app.consume(ACTION, "team-1", 1).await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.body);
    app.engine.drain_ledger_now().await;
    assert_no_drift(&app).await;
}

/// 300 concurrent requests from two instances (one in memory): holds over-captured and
/// plain consumes on five subjects, and a budget all of them share (on the cluster, in a
/// slot of its own: the excess goes there across slots). Whatever interleaving, usage
/// equals the ledger.
async fn over_captures_and_consumes_racing_leave_usage_equal_to_the_ledger(
    counters: CounterBackend,
) {
    let first = spawn_app(PolicyBackend::Postgres, counters).await;
    budgets(&first).await;
    first
        .must_create_policy(
            json!({"id": "tokens-all", "action": ACTION, "measure": "amount",
            "limit": 1_000_000, "scope": [],
            "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}),
        )
        .await;
    let mut apps = vec![Arc::new(first)];
    if counters != CounterBackend::Memory {
        apps.push(Arc::new(spawn_with(apps[0].settings.clone()).await));
    }
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let subject = format!("team-{}", i % 5);
            tokio::spawn(async move {
                if i % 3 == 0 {
                    let held = app
                        .quota(
                            "/quota/holds",
                            json!({"action": ACTION, "subject": subject, "amount": 300,
                                "ttl_seconds": 600}),
                        )
                        .await;
                    if held.status == StatusCode::OK {
                        let id = held.body["hold_id"].as_str().unwrap_or_default().to_owned();
                        let body = json!({"amount": 300 + (i % 7) * 100, "over_capture": true});
                        let done = commit(&app, &id, body).await;
                        assert_eq!(done.status, StatusCode::OK, "{}", done.body);
                    }
                } else {
                    let answer = app.consume(ACTION, &subject, 250).await;
                    assert!(
                        matches!(
                            answer.status,
                            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
                        ),
                        "{}",
                        answer.body
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a request task");
    }
    for app in &apps {
        app.engine.drain_ledger_now().await;
    }
    assert_no_drift(&apps[0]).await;
    let (status, printed) = cli_verify(&apps[0]).await;
    assert_eq!(status, 0, "{printed}");
}

crate::on_counter_stores!(
    an_over_capture_charges_the_excess_past_the_limit_until_a_refund,
    over_captures_and_consumes_racing_leave_usage_equal_to_the_ledger,
);
