//! Backtests: policies tried on the recorded past, checked against a model of the same
//! history computed here, independently of the service.

use crate::helpers::{spawn_app, start_instant, CounterBackend, PolicyBackend, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn sms(limit: u64) -> Value {
    json!({"id": "sms", "action": "sms.send", "measure": "count", "limit": limit,
        "ledger_denials": true,
        "window": {"type": "calendar", "period": "day", "timezone": "UTC"}})
}

/// What a subject did, in order, as the test made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A consume (or a hold), allowed live or not.
    Request { live: bool },
    /// A refund of the subject's first consume.
    RefundFirst,
    /// A release of the hold made just before.
    ReleaseHold,
    /// Midnight: a new day.
    NewDay,
}

/// `(requests, denied, newly_denied, newly_allowed)` of a count policy of `limit` a day
/// replayed over `history` (per subject).
fn model(history: &[Vec<Step>], limit: u64) -> (u64, u64, u64, u64) {
    let (mut requests, mut denied, mut newly_denied, mut newly_allowed) = (0, 0, 0, 0);
    for steps in history {
        let mut used = 0;
        let mut allowed = Vec::new();
        for step in steps {
            match *step {
                Step::Request { live } => {
                    requests += 1;
                    let ok = used < limit;
                    used += u64::from(ok);
                    allowed.push(ok);
                    denied += u64::from(!ok);
                    newly_denied += u64::from(live && !ok);
                    newly_allowed += u64::from(!live && ok);
                }
                Step::RefundFirst if allowed.first() == Some(&true) => used -= 1,
                Step::ReleaseHold if allowed.last() == Some(&true) => used -= 1,
                Step::RefundFirst | Step::ReleaseHold => {}
                Step::NewDay => used = 0,
            }
        }
    }
    (requests, denied, newly_denied, newly_allowed)
}

async fn consume(app: &TestApp, subject: &str, attributes: Value) -> (bool, Value) {
    let answer = app
        .quota(
            "/quota/consume",
            json!({"action": "sms.send", "subject": subject, "attributes": attributes}),
        )
        .await;
    assert!(
        matches!(
            answer.status,
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
        ),
        "{}",
        answer.body
    );
    (answer.status == StatusCode::OK, answer.body)
}

/// Two days of 100 subjects: subject i sends (i % 15) + 1 SMS on the first day (those past
/// 10 denied, and recorded), u-14 gets its first one refunded and sends one more, u-3
/// holds one and releases it; each sends 3 on the second day.
async fn history(app: &TestApp) -> Vec<Vec<Step>> {
    let mut history = vec![Vec::new(); 100];
    for (i, steps) in history.iter_mut().enumerate() {
        let subject = format!("u-{i}");
        let mut first = None;
        for _ in 0..(i % 15) + 1 {
            let (live, body) = consume(app, &subject, json!({})).await;
            first = first.or(body["consumption_id"].as_str().map(str::to_owned));
            steps.push(Step::Request { live });
        }
        if i == 14 {
            let refunded = app
                .quota("/quota/refund", json!({"consumption_id": first}))
                .await;
            assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.body);
            steps.push(Step::RefundFirst);
            let (live, _) = consume(app, &subject, json!({})).await;
            steps.push(Step::Request { live });
        }
        if i == 3 {
            let held = app
                .quota(
                    "/quota/holds",
                    json!({"action": "sms.send", "subject": subject, "ttl_seconds": 60}),
                )
                .await;
            assert_eq!(held.status, StatusCode::OK, "{}", held.body);
            steps.push(Step::Request { live: true });
            let id = held.body["hold_id"].as_str().unwrap();
            let released = app
                .quota(&format!("/quota/holds/{id}/release"), json!({}))
                .await;
            assert_eq!(released.status, StatusCode::OK, "{}", released.body);
            steps.push(Step::ReleaseHold);
        }
    }
    app.advance(86_400);
    for (i, steps) in history.iter_mut().enumerate() {
        steps.push(Step::NewDay);
        for _ in 0..3 {
            let (live, _) = consume(app, &format!("u-{i}"), json!({})).await;
            steps.push(Step::Request { live });
        }
    }
    history
}

async fn backtest(app: &TestApp, policies: Value) -> (StatusCode, Value) {
    let from = start_instant();
    let body = json!({"policies": policies, "from": from,
        "to": from + chrono::Duration::days(3)});
    let answer = app
        .send(
            app.admin(reqwest::Method::POST, "/admin/backtest")
                .json(&body),
        )
        .await;
    (answer.status, answer.body)
}

fn figures(answer: &Value) -> (u64, u64, u64, u64) {
    let p = &answer["policies"][0];
    let n = |field: &str| p[field].as_u64().unwrap_or(u64::MAX);
    (
        n("requests"),
        n("denied"),
        n("newly_denied"),
        n("newly_allowed"),
    )
}

async fn a_known_history_replays_exactly_under_stricter_and_looser_limits(
    counters: CounterBackend,
) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    app.must_create_policy(sms(10)).await;
    let history = history(&app).await;
    app.engine.drain_ledger_now().await;

    for limit in [10, 5, 12] {
        let (status, answer) = backtest(&app, json!([sms(limit)])).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let expected = model(&history, limit);
        assert_eq!(figures(&answer), expected, "limit {limit}: {answer}");
        if limit == 10 {
            assert_eq!(
                (expected.2, expected.3),
                (0, 0),
                "the live policy: nothing new"
            );
        }
    }
    let (_, strict) = backtest(&app, json!([sms(5)])).await;
    let p = &strict["policies"][0];
    assert_eq!(p["policy_id"], "sms");
    // u-14 sent 16 on the first day: 11 denied under 5 a day (its refund let one more in).
    assert_eq!(
        p["top_denied"][0],
        json!({"budget": {"subject": "u-14"}, "denied": 10}),
        "{p}"
    );
    assert_eq!(
        (&p["peak"]["used"], &p["peak"]["limit"]),
        (&json!(5), &json!(5)),
        "{p}"
    );
    assert!(p["top_denied"].as_array().unwrap().len() <= 10);
}

/// A per-country budget: the backtest names the country it denies most.
async fn a_scoped_budget_names_the_country_it_denies(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    let per_country = |limit: u64| {
        json!({"id": "sms-country", "action": "sms.send", "measure": "count",
            "limit": limit, "scope": ["country"], "ledger_denials": true,
            "window": {"type": "calendar", "period": "day", "timezone": "UTC"}})
    };
    app.must_create_policy(per_country(100)).await;
    for i in 0..30 {
        let country = if i % 3 == 0 { "fr" } else { "de" };
        let (live, _) = consume(&app, &format!("u-{i}"), json!({"country": country})).await;
        assert!(live);
    }
    app.engine.drain_ledger_now().await;
    let (status, answer) = backtest(&app, json!([per_country(8)])).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let p = &answer["policies"][0];
    // 20 from de (12 over 8), 10 from fr (2 over).
    assert_eq!(figures(&answer), (30, 14, 14, 0), "{answer}");
    assert_eq!(
        p["top_denied"],
        json!([{"budget": {"country": "de"}, "denied": 12},
               {"budget": {"country": "fr"}, "denied": 2}])
    );
}

/// A backtest running while consumes flow changes neither the live counters nor the
/// ledger: usage is what the consumes made, and `counters verify` finds no drift.
async fn a_backtest_beside_live_traffic_touches_nothing_live(counters: CounterBackend) {
    let app = std::sync::Arc::new(spawn_app(PolicyBackend::Postgres, counters).await);
    app.must_create_policy(sms(1_000)).await;
    for i in 0..200 {
        consume(&app, &format!("u-{}", i % 10), json!({})).await;
    }
    app.engine.drain_ledger_now().await;
    let flowing = {
        let app = app.clone();
        tokio::spawn(async move {
            for i in 0..100 {
                consume(&app, &format!("u-{}", i % 10), json!({})).await;
            }
        })
    };
    for _ in 0..3 {
        let (status, answer) = backtest(&app, json!([sms(5)])).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    flowing.await.unwrap();
    for i in 0..10 {
        let usage = app.usage("sms.send", &format!("u-{i}")).await;
        assert_eq!(
            usage.body["policies"][0]["used"],
            json!(30),
            "{}",
            usage.body
        );
    }
    app.engine.drain_ledger_now().await;
    let verified = app.admin_get("/admin/counters/verify").await;
    assert_eq!(verified.status, StatusCode::OK, "{}", verified.body);
    assert_eq!(verified.body["drift"], json!([]), "{}", verified.body);
    let ledger = app
        .admin_get("/quota/ledger?action=sms.send&limit=500")
        .await;
    assert_eq!(
        ledger.body["items"].as_array().map(Vec::len),
        Some(300),
        "only the consumes' entries"
    );
}

crate::on_counter_stores!(
    a_known_history_replays_exactly_under_stricter_and_looser_limits,
    a_scoped_budget_names_the_country_it_denies,
    a_backtest_beside_live_traffic_touches_nothing_live
);

#[tokio::test]
async fn bad_backtests_are_422_naming_the_field_and_change_nothing() {
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.ledger_retention_days = Some(30);
    let app = crate::helpers::spawn_with(settings).await;
    app.must_create_policy(sms(10)).await;
    let from = start_instant();
    let ask = |body: Value| {
        let app = &app;
        async move {
            let answer = app
                .send(
                    app.admin(reqwest::Method::POST, "/admin/backtest")
                        .json(&body),
                )
                .await;
            answer.assert_problem(422);
            answer
                .problem_fields()
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    let mut bad = sms(10);
    bad["limit"] = json!(-1);
    let day = chrono::Duration::days(1);
    let cases = [
        (
            json!({"policies": [sms(10), bad], "from": from, "to": from + day}),
            "policies[1].limit",
        ),
        (
            json!({"policies": [sms(10)], "from": from + day, "to": from}),
            "from",
        ),
        (
            json!({"policies": [sms(10)], "from": from, "to": from + day * 32}),
            "to",
        ),
        // Before what the ledger keeps (30 days).
        (
            json!({"policies": [sms(10)], "from": from - day * 40, "to": from - day * 39}),
            "from",
        ),
        (
            json!({"policies": [], "from": from, "to": from + day}),
            "policies",
        ),
        (json!({"policies": [sms(10)], "days": 32}), "days"),
        (
            json!({"policies": [sms(10)], "days": 2, "from": from}),
            "from",
        ),
    ];
    for (body, field) in cases {
        assert_eq!(ask(body.clone()).await, vec![field], "{body}");
    }
    let many: Vec<Value> = (0..33)
        .map(|i| {
            let mut p = sms(10);
            p["id"] = json!(format!("p{i}"));
            p
        })
        .collect();
    let fields = ask(json!({"policies": many, "from": from, "to": from + day})).await;
    assert_eq!(fields, vec!["policies"]);
    let listed = app.admin_get("/admin/policies").await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(1));
}

/// `policies diff FILE --backtest DAYS` prints the backtest beside the diff, and exits as
/// the diff does.
#[tokio::test]
async fn the_cli_prints_the_backtest_beside_the_diff() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(sms(10)).await;
    for _ in 0..12 {
        consume(&app, "u-1", json!({})).await;
    }
    let dir = std::env::temp_dir().join(format!("ql-backtest-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policies.json");
    std::fs::write(&file, json!({"policies": [sms(5)]}).to_string()).unwrap();
    let path = file.to_string_lossy().into_owned();
    let (code, out, err) =
        crate::helpers::cli(&app, &["policies", "diff", "--backtest", "7", &path]).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 2, "a change, as diff says: {out}{err}");
    assert!(out.contains("~ sms"), "the diff: {out}");
    assert!(
        out.contains("backtest over the last 7 day(s) of the ledger (12 entries replayed)")
            && out.contains(
                "sms: 12 requests, 7 denied (5 newly), 0 newly allowed; peak 5 of 5 (subject=u-1)"
            )
            && out.contains("denied most: subject=u-1 (7)"),
        "{out}"
    );
}
