//! Alerts: policies' `alert_thresholds`, validated at the edge.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend};
use reqwest::StatusCode;
use serde_json::json;

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
