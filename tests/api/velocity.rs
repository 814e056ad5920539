//! Velocity controls: calendar windows anchored where card programs and banks start their
//! periods (a 04:00 cut-off, weeks from Sunday, a month from the 15th, a fiscal year), on
//! every counter store, checked at their boundaries with the test clock.

mod over_capture;

use crate::helpers::{spawn_app, Answer, CounterBackend, PolicyBackend, TestApp};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("a well-formed instant")
        .with_timezone(&Utc)
}

/// An anchored calendar policy of `limit` on `action`.
fn anchored(id: &str, action: &str, limit: u64, window: Value) -> Value {
    json!({"id": id, "action": action, "measure": "count", "limit": limit, "window": window})
}

/// Consumes one unit at `when` (the app's clock is set there first).
async fn consume_at(app: &TestApp, when: &str, action: &str, subject: &str) -> Answer {
    app.clock.set(at(when));
    app.consume(action, subject, 1).await
}

/// The `resets_at` of the first policy of a consume answer.
fn resets_at(answer: &Answer) -> Value {
    answer.body["policies"][0]["resets_at"].clone()
}

/// Spends `limit` units at `from`, is denied at `last` (the period's last second), and is
/// allowed again at `next` (the next period's first), whose answer resets at `next_end`.
#[expect(clippy::too_many_arguments, reason = "one boundary, read as one row")]
async fn boundary(
    app: &TestApp,
    action: &str,
    subject: &str,
    limit: u64,
    from: &str,
    last: &str,
    next: &str,
    next_end: &str,
) {
    for _ in 0..limit {
        let allowed = consume_at(app, from, action, subject).await;
        assert_eq!(
            allowed.status,
            StatusCode::OK,
            "{action} at {from}: {}",
            allowed.body
        );
        assert_eq!(
            resets_at(&allowed),
            json!(next),
            "{action}: the period ends at {next}"
        );
    }
    let denied = consume_at(app, last, action, subject).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{action} at {last}, the period's last second: {}",
        denied.body
    );
    let again = consume_at(app, next, action, subject).await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "{action} at {next}: {}",
        again.body
    );
    assert_eq!(resets_at(&again), json!(next_end), "{action} after {next}");
}

async fn anchored_periods_reset_at_their_anchors(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    let policies = [
        // A bank's 04:00 cut-off in New York, across the fall-back night (a 25-hour day).
        anchored(
            "cut-off",
            "transfer",
            2,
            json!({"type": "calendar", "period": "day",
            "timezone": "America/New_York", "day_start": "04:00"}),
        ),
        // Weeks from Sunday, in Kathmandu (+05:45).
        anchored(
            "weekly",
            "atm",
            1,
            json!({"type": "calendar", "period": "week",
            "timezone": "Asia/Kathmandu", "week_start": "sunday"}),
        ),
        // A billing month from the 31st: February's period starts on the 28th.
        anchored(
            "billing",
            "api",
            1,
            json!({"type": "calendar", "period": "month",
            "timezone": "UTC", "month_day": 31}),
        ),
        // Years across New Year at UTC+14 and UTC-11.
        anchored(
            "kiritimati",
            "yearly-east",
            1,
            json!({"type": "calendar", "period": "year",
            "timezone": "Pacific/Kiritimati"}),
        ),
        anchored(
            "pago-pago",
            "yearly-west",
            1,
            json!({"type": "calendar", "period": "year",
            "timezone": "Pacific/Pago_Pago"}),
        ),
        // A fiscal year from April 6th.
        anchored(
            "fiscal",
            "payroll",
            1,
            json!({"type": "calendar", "period": "year",
            "timezone": "Europe/London", "year_month": 4, "month_day": 6}),
        ),
    ];
    for policy in policies {
        app.must_create_policy(policy).await;
    }
    #[rustfmt::skip]
    let rows = [
        // New York's 2026-10-31 04:00 EDT (08:00Z) to 11-01 04:00 EST (09:00Z): 25 hours.
        ("transfer", 2, "2026-10-31T12:00:00Z", "2026-11-01T08:59:59Z", "2026-11-01T09:00:00Z", "2026-11-02T09:00:00Z"),
        // Sunday 2026-11-29 00:00 in Kathmandu is 11-28 18:15Z.
        ("atm", 1, "2026-11-25T00:00:00Z", "2026-11-28T18:14:59Z", "2026-11-28T18:15:00Z", "2026-12-05T18:15:00Z"),
        // 2027-01-31 .. 2027-02-28 .. 2027-03-31.
        ("api", 1, "2027-02-10T00:00:00Z", "2027-02-27T23:59:59Z", "2027-02-28T00:00:00Z", "2027-03-31T00:00:00Z"),
        ("yearly-east", 1, "2026-06-01T00:00:00Z", "2026-12-31T09:59:59Z", "2026-12-31T10:00:00Z", "2027-12-31T10:00:00Z"),
        ("yearly-west", 1, "2026-06-01T00:00:00Z", "2027-01-01T10:59:59Z", "2027-01-01T11:00:00Z", "2028-01-01T11:00:00Z"),
        // April 6th 00:00 in London is BST: 04-05 23:00Z.
        ("payroll", 1, "2026-12-01T00:00:00Z", "2027-04-05T22:59:59Z", "2027-04-05T23:00:00Z", "2028-04-05T23:00:00Z"),
    ];
    for (action, limit, from, last, next, next_end) in rows {
        boundary(&app, action, "card-1", limit, from, last, next, next_end).await;
    }
    // The anchors read back as written, and the plain default is not written out.
    let policy = app.admin_get("/admin/policies/fiscal").await;
    assert_eq!(policy.body["window"]["year_month"], 4, "{}", policy.body);
    assert_eq!(policy.body["window"]["month_day"], 6);
    assert_eq!(policy.body["window"].get("day_start"), None);
}

crate::on_counter_stores!(
    anchored_periods_reset_at_their_anchors,
    match_not_applies_only_outside_the_values_it_lists,
    a_per_request_maximum_denies_above_it_and_accumulates_nothing,
    a_lifetime_counts_the_whole_ledger_across_years_restarts_and_a_redis_loss,
);

#[tokio::test]
async fn anchors_a_period_does_not_use_are_422_naming_the_field_and_create_nothing() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let cases = [
        (
            json!({"period": "hour", "day_start": "02:30"}),
            "window.day_start",
        ),
        (
            json!({"period": "day", "day_start": "24:00"}),
            "window.day_start",
        ),
        (
            json!({"period": "day", "week_start": "sunday"}),
            "window.week_start",
        ),
        (
            json!({"period": "week", "week_start": "sun"}),
            "window.week_start",
        ),
        (
            json!({"period": "week", "month_day": 1}),
            "window.month_day",
        ),
        (
            json!({"period": "month", "month_day": 32}),
            "window.month_day",
        ),
        (
            json!({"period": "month", "year_month": 3}),
            "window.year_month",
        ),
        (
            json!({"period": "year", "year_month": 0}),
            "window.year_month",
        ),
    ];
    for (i, (window, field)) in cases.into_iter().enumerate() {
        let mut window = window;
        window["type"] = json!("calendar");
        let answer = app
            .create_policy(anchored(&format!("p{i}"), "a", 1, window.clone()))
            .await;
        let problem = answer.assert_problem(422);
        assert_eq!(answer.problem_fields(), vec![field], "{window}: {problem}");
    }
    let listed = app.admin_get("/admin/policies").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was created");
}

#[tokio::test]
async fn a_year_period_needs_the_ledger_kept_a_year() {
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.ledger_retention_days = Some(90);
    let app = crate::helpers::spawn_with(settings).await;
    let yearly = anchored("y", "a", 1, json!({"type": "calendar", "period": "year"}));
    let problem = app.create_policy(yearly).await;
    let body = problem.assert_problem(422);
    assert_eq!(body["errors"][0]["field"], "window.period", "{body}");
    let monthly = anchored("m", "a", 1, json!({"type": "calendar", "period": "month"}));
    assert_eq!(app.create_policy(monthly).await.status, StatusCode::CREATED);
}

/// A consume of `amount` by `subject` with `country` (and a `channel` when given).
async fn consume_in(app: &TestApp, subject: &str, country: &str, channel: Option<&str>) -> Answer {
    let mut attributes = json!({"country": country});
    if let Some(channel) = channel {
        attributes["channel"] = json!(channel);
    }
    app.quota(
        "/quota/consume",
        json!({"action": "card.auth", "subject": subject, "amount": 1, "attributes": attributes}),
    )
    .await
}

/// The ids of the policies a consume answer lists (those that applied).
fn applied(answer: &Answer) -> Vec<String> {
    answer.body["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["policy_id"].as_str().map(str::to_owned))
        .collect()
}

async fn match_not_applies_only_outside_the_values_it_lists(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    let day = json!({"type": "calendar", "period": "day", "timezone": "UTC"});
    // No cash withdrawals abroad: 0 outside US and CA, alone and beside a match.
    app.must_create_policy(
        json!({"id": "abroad", "action": "card.auth", "measure": "count",
        "limit": 0, "window": day, "match_not": {"country": ["US", "CA"]}}),
    )
    .await;
    app.must_create_policy(
        json!({"id": "atm-abroad", "action": "card.auth", "measure": "count",
        "limit": 1, "window": day, "match": {"channel": ["atm"]},
        "match_not": {"country": ["US"]}}),
    )
    .await;
    app.must_create_policy(
        json!({"id": "all", "action": "card.auth", "measure": "count",
        "limit": 100, "window": day}),
    )
    .await;

    let home = consume_in(&app, "c1", "US", None).await;
    assert_eq!(home.status, StatusCode::OK, "{}", home.body);
    assert_eq!(
        applied(&home),
        vec!["all"],
        "neither match_not applies at home"
    );
    let canada = consume_in(&app, "c1", "CA", Some("atm")).await;
    assert_eq!(canada.status, StatusCode::OK, "{}", canada.body);
    assert_eq!(
        applied(&canada),
        vec!["all", "atm-abroad"],
        "abroad for the ATM rule only"
    );
    let france = consume_in(&app, "c1", "FR", None).await;
    assert_eq!(
        france.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        france.body
    );
    assert_eq!(applied(&france), vec!["abroad", "all"]);
    // A request without the key is not excluded, so the policy does not apply.
    let unknown = app
        .quota(
            "/quota/consume",
            json!({"action": "card.auth", "subject": "c1", "amount": 1}),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::OK, "{}", unknown.body);
    assert_eq!(applied(&unknown), vec!["all"]);

    let stored = app.admin_get("/admin/policies/atm-abroad").await;
    assert_eq!(
        stored.body["match_not"],
        json!({"country": ["US"]}),
        "{}",
        stored.body
    );
    assert_eq!(stored.body["match"], json!({"channel": ["atm"]}));
    let bad = app
        .create_policy(
            json!({"id": "bad", "action": "card.auth", "measure": "count",
            "limit": 1, "window": day, "match_not": {"country": []}}),
        )
        .await;
    assert_eq!(
        bad.assert_problem(422)["errors"][0]["field"],
        "match_not.country"
    );
}

async fn a_per_request_maximum_denies_above_it_and_accumulates_nothing(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    let day = json!({"type": "calendar", "period": "day", "timezone": "UTC"});
    app.must_create_policy(
        json!({"id": "per-auth", "action": "card.spend", "measure": "amount",
        "limit": 50_000, "window": {"type": "request"}}),
    )
    .await;
    app.must_create_policy(
        json!({"id": "daily", "action": "card.spend", "measure": "amount",
        "limit": 200_000, "window": day}),
    )
    .await;
    let used = |answer: &Answer, id: &str| {
        answer.body["policies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["policy_id"] == id)
            .map(|p| (p["used"].clone(), p["allowed"].clone()))
    };
    for _ in 0..2 {
        let at_limit = app.consume("card.spend", "card-1", 50_000).await;
        assert_eq!(at_limit.status, StatusCode::OK, "{}", at_limit.body);
        assert_eq!(
            used(&at_limit, "per-auth"),
            Some((json!(50_000), json!(true)))
        );
    }
    let above = app.consume("card.spend", "card-1", 50_001).await;
    assert_eq!(
        above.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        above.body
    );
    assert_eq!(
        above.body["retry_after_seconds"],
        Value::Null,
        "it never passes later"
    );
    assert_eq!(above.header("retry-after"), None);
    assert_eq!(
        used(&above, "per-auth"),
        Some((json!(50_001), json!(false)))
    );
    // The day has room (100,000 + 50,001): the maximum alone denies, and nothing is
    // charged.
    assert_eq!(
        used(&above, "daily"),
        Some((json!(100_000), json!(true))),
        "nothing charged"
    );

    let usage = app.usage("card.spend", "card-1").await;
    assert_eq!(
        used(&usage, "per-auth").map(|u| u.0),
        Some(json!(0)),
        "nothing accumulates"
    );
    assert_eq!(used(&usage, "daily").map(|u| u.0), Some(json!(100_000)));

    // A refund gives back to the day only; the per-request maximum had nothing to give.
    let charged = app.consume("card.spend", "card-2", 10_000).await;
    let refund = app
        .quota(
            "/quota/refund",
            json!({"consumption_id": charged.body["consumption_id"]}),
        )
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    let policies: Vec<&Value> = refund.body["entry"]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(policies.len(), 1, "{}", refund.body);
    assert_eq!(policies[0]["policy_id"], "daily");
    let verify = app.admin_get("/admin/counters/verify").await;
    assert_eq!(verify.body["drift"], json!([]), "{}", verify.body);
}

/// The lifetime policy's `used` for `subject`, from a usage read.
async fn lifetime_used(app: &TestApp, subject: &str) -> Value {
    let usage = app.usage("card.spend", subject).await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    usage.body["policies"][0]["used"].clone()
}

async fn a_lifetime_counts_the_whole_ledger_across_years_restarts_and_a_redis_loss(
    counters: CounterBackend,
) {
    let mut settings = crate::helpers::fresh_settings(PolicyBackend::Sqlite, counters).await;
    settings.ledger_retention_days = None;
    let app = crate::helpers::spawn_with(settings).await;
    app.must_create_policy(
        json!({"id": "prepaid", "action": "card.spend", "measure": "amount",
        "limit": 100_000, "window": {"type": "lifetime"}}),
    )
    .await;
    let first = app.consume("card.spend", "card-1", 60_000).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(resets_at(&first), Value::Null, "it never resets");
    assert_eq!(
        first.header("ratelimit"),
        Some("\"prepaid\";r=40000"),
        "no reset time"
    );
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"prepaid\";q=100000")
    );
    app.engine.drain_ledger_now().await;

    // Two years on, far past every other window's horizon, after a crash: the counters
    // come back from the whole ledger.
    app.advance(2 * 366 * 86_400);
    let app = app.crash_restart().await;
    assert_eq!(lifetime_used(&app, "card-1").await, json!(60_000));
    if counters != CounterBackend::Memory {
        let nodes = match counters {
            CounterBackend::Cluster => crate::helpers::cluster_urls(),
            _ => app.settings.redis_urls.clone(),
        };
        crate::redis_loss::lose_keys(&app, &nodes).await;
        let mut used = Value::Null;
        for _ in 0..100 {
            let answer = app.check("card.spend", "card-1", 1).await;
            if answer.status == StatusCode::OK {
                used = answer.body["policies"][0]["used"].clone();
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(used, json!(60_000), "rebuilt after the loss");
    }
    let over = app.consume("card.spend", "card-1", 40_001).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.body);
    assert_eq!(
        over.body["retry_after_seconds"],
        Value::Null,
        "never passes later"
    );
    assert_eq!(over.header("retry-after"), None);
    let rest = app.consume("card.spend", "card-1", 40_000).await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    let refund = app
        .quota(
            "/quota/refund",
            json!({"consumption_id": rest.body["consumption_id"], "amount": 15_000}),
        )
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    assert_eq!(lifetime_used(&app, "card-1").await, json!(85_000));
    let app = app.restart().await;
    assert_eq!(lifetime_used(&app, "card-1").await, json!(85_000));
    let verify = app.admin_get("/admin/counters/verify").await;
    assert_eq!(verify.body["drift"], json!([]), "{}", verify.body);
}

#[tokio::test]
async fn a_lifetime_needs_the_ledger_kept_for_ever() {
    let lifetime = json!({"id": "prepaid", "action": "card.spend", "measure": "amount",
        "limit": 100_000, "window": {"type": "lifetime"}});
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let refused = app.create_policy(lifetime.clone()).await;
    let body = refused.assert_problem(422);
    assert_eq!(refused.problem_fields(), vec!["window.type"], "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("QUOTA_LEDGER_RETENTION_DAYS=forever")),
        "{body}"
    );
    let listed = app.admin_get("/admin/policies").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was created");

    // Kept for ever, it is created; an instance that would delete entries then refuses to
    // start, saying why.
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.ledger_retention_days = None;
    let app = crate::helpers::spawn_with(settings).await;
    app.must_create_policy(lifetime).await;
    let error = app
        .restart_refused(|settings| settings.ledger_retention_days = Some(400))
        .await;
    assert!(
        error.contains("policy prepaid has a lifetime window")
            && error.contains("QUOTA_LEDGER_RETENTION_DAYS=forever"),
        "{error}"
    );
}
