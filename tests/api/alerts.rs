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
pub(crate) async fn outbox(app: &TestApp) -> Vec<(String, Value)> {
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
    // An entry the killed instance's drain had read waits until a living one claims it
    // (after QUOTA_LEDGER_CLAIM_IDLE_MS, 1 s here): its event comes with it.
    let events = crate::helpers::eventually(
        std::time::Duration::from_secs(30),
        "both events in the outbox",
        || async {
            let events = outbox(&app).await;
            (events.len() >= 2).then_some(events)
        },
    )
    .await;
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

/// The outbox's events as `(type, policy, threshold, used)`, oldest first.
async fn crossings(app: &TestApp) -> Vec<(String, String, u64, u64)> {
    outbox(app)
        .await
        .into_iter()
        .map(|(kind, p)| {
            (
                kind,
                p["policy_id"].as_str().unwrap_or_default().to_owned(),
                p["threshold"].as_u64().unwrap_or_default(),
                p["used"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

fn crossing(kind: &str, policy: &str, threshold: u64, used: u64) -> (String, String, u64, u64) {
    let kind = match kind {
        "reached" => "budget.threshold",
        _ => "budget.threshold.resolved",
    };
    (kind.to_owned(), policy.to_owned(), threshold, used)
}

/// A consume of `sms.send` by user-1; its consumption id.
async fn consumed(app: &TestApp) -> String {
    let answer = app
        .quota(
            "/quota/consume",
            json!({"action": "sms.send", "subject": "user-1"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["consumption_id"].as_str().unwrap().to_owned()
}

async fn refund(app: &TestApp, consumption_id: &str) {
    let answer = app
        .quota("/quota/refund", json!({"consumption_id": consumption_id}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
}

async fn refunds_resolve_shadow_policies_alert_and_a_new_period_rearms(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(policy(json!([50, 100]))).await;
    // A soft limit: shadow, alerting at 100%.
    app.must_create_policy(
        json!({"id": "soft", "action": "sms.send", "measure": "count",
        "limit": 4, "mode": "shadow", "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [100]}),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(consumed(&app).await);
    }
    // A refund takes sms below 50% (5 -> 4): resolved; soft stays at its limit (4 of 4).
    refund(&app, &ids[4]).await;
    // Another takes soft below its limit (4 -> 3).
    refund(&app, &ids[3]).await;
    // Up again: both thresholds are armed again, and are reached again.
    consumed(&app).await;
    consumed(&app).await;
    assert_eq!(
        crossings(&app).await,
        vec![
            crossing("reached", "soft", 100, 4),
            crossing("reached", "sms", 50, 5),
            crossing("resolved", "sms", 50, 4),
            crossing("resolved", "soft", 100, 3),
            crossing("reached", "soft", 100, 4),
            crossing("reached", "sms", 50, 5),
        ]
    );
    // The next day starts from nothing: its fifth consume reaches 50% again.
    app.advance(86_400);
    for _ in 0..5 {
        consumed(&app).await;
    }
    let events = crossings(&app).await;
    assert_eq!(
        events[6..],
        [
            crossing("reached", "soft", 100, 4),
            crossing("reached", "sms", 50, 5),
        ],
        "{events:?}"
    );
}

async fn a_released_hold_resolves_and_an_over_capture_reaches(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(json!({"id": "spend", "action": "pay", "measure": "amount",
        "limit": 1000, "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [80]}))
        .await;
    let hold = |amount: u64| {
        let app = &app;
        async move {
            let answer = app
                .quota(
                    "/quota/holds",
                    json!({"action": "pay", "subject": "card-1", "amount": amount,
                        "ttl_seconds": 600}),
                )
                .await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            answer.body["hold_id"].as_str().unwrap().to_owned()
        }
    };
    // Expires: all of it goes back.
    hold(900).await;
    app.advance(601);
    app.engine.expire_due_holds().await;
    // Released: the same.
    let second = hold(900).await;
    let released = app
        .quota(&format!("/quota/holds/{second}/release"), json!({}))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    // Over-captured: the excess takes it past 80%.
    let third = hold(500).await;
    let committed = app
        .quota(
            &format!("/quota/holds/{third}/commit"),
            json!({"amount": 850, "over_capture": true}),
        )
        .await;
    assert_eq!(committed.status, StatusCode::OK, "{}", committed.body);
    // A partial commit gives the rest back, staying above 80% (950 -> 870): nothing.
    let fourth = hold(100).await;
    let partial = app
        .quota(
            &format!("/quota/holds/{fourth}/commit"),
            json!({"amount": 20}),
        )
        .await;
    assert_eq!(partial.status, StatusCode::OK, "{}", partial.body);
    assert_eq!(
        crossings(&app).await,
        vec![
            crossing("reached", "spend", 80, 900),
            crossing("resolved", "spend", 80, 0),
            crossing("reached", "spend", 80, 900),
            crossing("resolved", "spend", 80, 0),
            crossing("reached", "spend", 80, 850),
        ]
    );
}

/// A shadow policy of limit 0 that alerts has no threshold above 0 to cross: the consumes
/// of its action are served (it is shadow), and no crossing is recorded.
async fn a_policy_with_no_level_to_cross_is_served_and_alerts_nothing(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(
        json!({"id": "sms", "action": "sms.send", "measure": "count",
        "limit": 10, "window": {"type": "calendar", "period": "day"}}),
    )
    .await;
    app.must_create_policy(
        json!({"id": "watch", "action": "sms.send", "measure": "count",
        "limit": 0, "mode": "shadow", "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [100]}),
    )
    .await;
    for _ in 0..5 {
        consumed(&app).await;
    }
    assert_eq!(crossings(&app).await, vec![]);
}

crate::on_counter_stores!(
    a_policy_with_no_level_to_cross_is_served_and_alerts_nothing,
    ten_consumes_record_one_event_per_threshold_reached,
    refunds_resolve_shadow_policies_alert_and_a_new_period_rearms,
    a_released_hold_resolves_and_an_over_capture_reaches,
    a_shared_budget_alerts_once_per_crossing
);

/// A budget all subjects share (on the cluster, in a slot of its own: a consume crosses
/// slots, and a refund gives back to it in a second step): its crossings are recorded
/// once, whoever makes them, and a refund below a threshold resolves it.
async fn a_shared_budget_alerts_once_per_crossing(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(
        json!({"id": "all", "action": "sms.send", "measure": "count",
        "limit": 10, "scope": [], "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [50, 100]}),
    )
    .await;
    let mut last = Value::Null;
    for i in 0..10 {
        let answer = app.consume("sms.send", &format!("user-{i}"), 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        last = answer.body["consumption_id"].clone();
    }
    let refunded = app
        .quota("/quota/refund", json!({"consumption_id": last}))
        .await;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.body);
    let events = outbox(&app).await;
    let mut seen: Vec<(&str, Value, Value, Value)> = events
        .iter()
        .map(|(kind, p)| {
            (
                kind.as_str(),
                p["threshold"].clone(),
                p["used"].clone(),
                p["budget"].clone(),
            )
        })
        .collect();
    // Different subjects' entries may be recorded in either order (docs/alerts.md).
    seen.sort_by_key(|(kind, threshold, _, _)| (*kind, threshold.as_u64()));
    assert_eq!(
        seen,
        vec![
            ("budget.threshold", json!(50), json!(5), json!({})),
            ("budget.threshold", json!(100), json!(10), json!({})),
            ("budget.threshold.resolved", json!(100), json!(9), json!({})),
        ],
        "{events:?}"
    );
    crate::integrity::assert_no_drift(&app).await;
}

/// On a Redis Cluster, a refund gives a shared budget's share back in a second step, after
/// its entry: when the instance fails before recording the events that step tells, the
/// sweeper gives the share again (its marker makes it a replay of the same report) and
/// records them, once; the counters still agree with the ledger.
#[tokio::test]
async fn a_shared_budget_resolves_through_the_sweeper_when_the_second_step_fails() {
    let app = spawn_app(PolicyBackend::Postgres, CounterBackend::Cluster).await;
    app.must_create_policy(
        json!({"id": "all", "action": "sms.send", "measure": "count",
        "limit": 4, "scope": [], "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [100]}),
    )
    .await;
    let mut last = Value::Null;
    for i in 0..4 {
        let answer = app.consume("sms.send", &format!("user-{i}"), 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        last = answer.body["consumption_id"].clone();
    }
    app.engine.faults().arm("crossslot.events");
    let refunded = app
        .quota("/quota/refund", json!({"consumption_id": last}))
        .await;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.body);
    let kinds = |events: Vec<(String, Value)>| -> Vec<String> {
        events.into_iter().map(|(kind, _)| kind).collect()
    };
    assert_eq!(kinds(outbox(&app).await), vec!["budget.threshold"]);
    app.engine.faults().clear();
    // The sweeper takes the pending share past its deadline (5 s, and 5 s of skew).
    app.advance(11);
    crate::helpers::eventually(
        std::time::Duration::from_secs(30),
        "the sweeper records the resolved event",
        || async { (outbox(&app).await.len() == 2).then_some(()) },
    )
    .await;
    let events = outbox(&app).await;
    assert_eq!(events[1].0, "budget.threshold.resolved", "{events:?}");
    assert_eq!(events[1].1["used"], 3, "{events:?}");
    crate::integrity::assert_no_drift(&app).await;
}
