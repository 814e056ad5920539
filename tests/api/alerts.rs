//! Alerts: policies' `alert_thresholds`, validated at the edge, and the events the ledger
//! records when a budget crosses one: exactly one per crossing, in the outbox
//! (`alert_events`) with the entry, whatever retries, crashes and backends.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::{Connection, Row};

fn policy(thresholds: serde_json::Value) -> serde_json::Value {
    json!({"id": "sms", "action": "sms.send", "measure": "count", "limit": 10,
        "window": {"type": "calendar", "period": "day"}, "alert_thresholds": thresholds})
}

#[tokio::test]
async fn thresholds_are_kept_ascending_and_bad_ones_are_422_naming_the_entry() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    for (thresholds, field) in [
        (json!([0]), "alert_thresholds[0]"),
        (json!([50, 101]), "alert_thresholds[1]"),
        (json!([80, 80]), "alert_thresholds[1]"),
        (json!([1, 2, 3, 4, 5, 6, 7, 8, 9]), "alert_thresholds"),
    ] {
        let answer = app.create_policy(policy(thresholds.clone())).await;
        let body = answer.assert_problem(422);
        assert_eq!(answer.problem_fields(), vec![field], "{thresholds}: {body}");
    }
    let mut per_request = policy(json!([50]));
    per_request["window"] = json!({"type": "request"});
    let answer = app.create_policy(per_request).await;
    answer.assert_problem(422);
    assert_eq!(answer.problem_fields(), vec!["alert_thresholds"]);
    let listed = app.admin_get("/admin/policies").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was created");

    let created = app.must_create_policy(policy(json!([100, 50, 80]))).await;
    assert_eq!(created["alert_thresholds"], json!([50, 80, 100]));
    let read = app.admin_get("/admin/policies/sms").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body["alert_thresholds"], json!([50, 80, 100]));
    let without = app
        .create_policy(
            json!({"id": "plain", "action": "sms.send", "measure": "count",
            "limit": 10, "window": {"type": "calendar", "period": "day"}}),
        )
        .await;
    assert_eq!(
        without.body["alert_thresholds"],
        json!([]),
        "{}",
        without.body
    );
}

/// The outbox's events, oldest first, as (type, payload).
async fn outbox(app: &TestApp) -> Vec<(String, Value)> {
    app.engine.drain_ledger_now().await;
    let url = app.settings.database_url.as_str();
    let sql = "SELECT event_type, payload FROM alert_events ORDER BY seq";
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&mut conn).await.unwrap();
        rows.iter()
            .map(|r| {
                let payload: String = r.get(1);
                (r.get(0), serde_json::from_str(&payload).unwrap())
            })
            .collect()
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&mut conn).await.unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }
}

/// A consume of `sms.send` by user-1, keyed `key` when given.
async fn send(app: &TestApp, key: Option<&str>) -> StatusCode {
    let mut body = json!({"action": "sms.send", "subject": "user-1"});
    if let Some(key) = key {
        body["idempotency_key"] = json!(key);
    }
    let answer = app.quota("/quota/consume", body).await;
    answer.status
}

async fn ten_consumes_record_one_event_per_threshold_reached(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(policy(json!([50, 100]))).await;
    for i in 1..=4 {
        assert_eq!(send(&app, None).await, StatusCode::OK, "consume {i}");
    }
    // The fifth reaches 50%; its retry replays, and adds no event.
    assert_eq!(send(&app, Some("fifth")).await, StatusCode::OK);
    assert_eq!(send(&app, Some("fifth")).await, StatusCode::OK);
    // Killed right after: the event comes with its entry.
    let app = app.crash_restart().await;
    for i in 6..=10 {
        assert_eq!(send(&app, None).await, StatusCode::OK, "consume {i}");
    }
    assert_eq!(send(&app, None).await, StatusCode::TOO_MANY_REQUESTS);
    let events = outbox(&app).await;
    let seen: Vec<(String, Value, Value, Value)> = events
        .iter()
        .map(|(kind, p)| {
            (
                kind.clone(),
                p["threshold"].clone(),
                p["used"].clone(),
                p["budget"].clone(),
            )
        })
        .collect();
    let user = json!({"subject": "user-1"});
    assert_eq!(
        seen,
        vec![
            (
                "budget.threshold".to_owned(),
                json!(50),
                json!(5),
                user.clone()
            ),
            ("budget.threshold".to_owned(), json!(100), json!(10), user),
        ],
        "{events:?}"
    );
    let (_, first) = &events[0];
    assert_eq!(
        (
            &first["type"],
            &first["policy_id"],
            &first["limit"],
            &first["action"]
        ),
        (
            &json!("budget.threshold"),
            &json!("sms"),
            &json!(10),
            &json!("sms.send")
        )
    );
    assert!(
        first["resets_at"].is_string() && first["at"].is_string(),
        "{first}"
    );
    assert_ne!(events[0].1["id"], events[1].1["id"]);
}

crate::on_counter_stores!(ten_consumes_record_one_event_per_threshold_reached);
