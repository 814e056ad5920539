//! The engine's conformance suite over real HTTP: every scenario runs on the in-process
//! counters, on real Redis and on a real 3-master Redis Cluster, with a fake clock.

use crate::helpers::{app_with, calendar_policy, CounterBackend};
use crate::on_counter_stores;
use chrono::{TimeZone, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn policy<'a>(body: &'a Value, id: &str) -> &'a Value {
    body["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["policy_id"] == id))
        .unwrap_or_else(|| panic!("no entry for {id} in {body}"))
}

async fn sms_per_day_resets_at_midnight_in_new_york(counters: CounterBackend) {
    let app = app_with(
        counters,
        &[calendar_policy(
            "sms-daily",
            "sms.send",
            3,
            "day",
            "America/New_York",
        )],
    )
    .await;
    for used in 1..=3 {
        let answer = app.consume("sms.send", "user-42", 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        let entry = policy(&answer.body, "sms-daily");
        assert_eq!(entry["used"], used);
        assert_eq!(entry["remaining"], 3 - used);
        assert_eq!(entry["resets_at"], "2026-11-22T05:00:00Z");
        assert_eq!(answer.body["allowed"], true);
        assert_eq!(answer.body["replayed"], false);
        assert!(answer.body["consumption_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()));
    }
    let denied = app.consume("sms.send", "user-42", 1).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.body["allowed"], false);
    // 12:00Z is 07:00 in New York; midnight there is 05:00Z tomorrow: 17 hours.
    assert_eq!(denied.body["retry_after_seconds"], 17 * 3600);
    assert_eq!(denied.header("retry-after"), Some("61200"));
    assert_eq!(
        policy(&denied.body, "sms-daily")["used"],
        3,
        "a denial charges nothing"
    );
    assert_eq!(
        app.consume("sms.send", "someone-else", 1).await.status,
        StatusCode::OK
    );

    app.clock.set(
        Utc.with_ymd_and_hms(2026, 11, 22, 4, 59, 59)
            .single()
            .unwrap(),
    );
    let still = app.consume("sms.send", "user-42", 1).await;
    assert_eq!(still.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(still.body["retry_after_seconds"], 1);
    app.advance(1);
    let next_day = app.consume("sms.send", "user-42", 1).await;
    assert_eq!(next_day.status, StatusCode::OK);
    assert_eq!(policy(&next_day.body, "sms-daily")["used"], 1);
    assert_eq!(
        policy(&next_day.body, "sms-daily")["resets_at"],
        "2026-11-23T05:00:00Z"
    );
}

async fn the_day_after_dst_ends_in_new_york_is_25_hours(counters: CounterBackend) {
    let app = app_with(
        counters,
        &[calendar_policy("d", "a", 1, "day", "America/New_York")],
    )
    .await;
    app.clock.set(
        Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0)
            .single()
            .unwrap(),
    );
    let answer = app.consume("a", "s", 1).await;
    assert_eq!(
        policy(&answer.body, "d")["resets_at"],
        "2026-11-02T05:00:00Z"
    );
    assert_eq!(answer.header("ratelimit-policy"), Some("\"d\";q=1;w=90000"));
}

async fn dollars_per_rolling_day_are_counted_in_minor_units(counters: CounterBackend) {
    let transfer = json!({"id": "transfer-usd-daily", "action": "transfer", "measure": "amount",
        "unit": "USD cents", "limit": 200000,
        "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600}});
    let app = app_with(counters, &[transfer]).await;
    let first = app.consume("transfer", "user-42", 150000).await;
    assert_eq!(first.status, StatusCode::OK);
    let entry = policy(&first.body, "transfer-usd-daily");
    assert_eq!(
        (entry["used"].clone(), entry["remaining"].clone()),
        (json!(150000), json!(50000))
    );
    // The charge sits in the 12:00-13:00 bucket, which counts until 13:00 tomorrow.
    assert_eq!(entry["resets_at"], "2026-11-22T13:00:00Z");

    let over = app.consume("transfer", "user-42", 60000).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over.body["retry_after_seconds"], 25 * 3600);
    let never = app.consume("transfer", "user-42", 250000).await;
    assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        never.body["retry_after_seconds"],
        Value::Null,
        "above the limit it never passes"
    );
    assert!(never.header("retry-after").is_none());

    app.advance(6 * 3600);
    let rest = app.consume("transfer", "user-42", 50000).await;
    assert_eq!(rest.status, StatusCode::OK);
    assert_eq!(policy(&rest.body, "transfer-usd-daily")["remaining"], 0);
    app.clock.set(
        Utc.with_ymd_and_hms(2026, 11, 22, 13, 0, 0)
            .single()
            .unwrap(),
    );
    let after = app.usage("transfer", "user-42").await;
    assert_eq!(
        policy(&after.body, "transfer-usd-daily")["used"],
        50000,
        "the first charge has expired"
    );
}

async fn a_token_bucket_allows_a_burst_then_refills_smoothly(counters: CounterBackend) {
    let bucket = json!({"id": "api-calls", "action": "api.call", "measure": "count", "limit": 10,
        "window": {"type": "token_bucket", "seconds": 10}});
    let app = app_with(counters, &[bucket]).await;
    for _ in 0..10 {
        assert_eq!(
            app.consume("api.call", "key-1", 1).await.status,
            StatusCode::OK
        );
    }
    let denied = app.consume("api.call", "key-1", 1).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.body["retry_after_seconds"], 1);
    assert_eq!(
        policy(&denied.body, "api-calls")["resets_at"],
        "2026-11-21T12:00:10Z"
    );
    app.advance(1);
    assert_eq!(
        app.consume("api.call", "key-1", 1).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.consume("api.call", "key-1", 1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.advance(5);
    let usage = app.usage("api.call", "key-1").await;
    assert_eq!(policy(&usage.body, "api-calls")["used"], 5);
}

async fn all_policies_pass_and_are_charged_or_none_is(counters: CounterBackend) {
    let count = calendar_policy("transfers-per-day", "transfer", 2, "day", "UTC");
    let amount = json!({"id": "dollars-per-day", "action": "transfer", "measure": "amount", "limit": 1000,
        "window": {"type": "calendar", "period": "day"}});
    let app = app_with(counters, &[count, amount]).await;
    assert_eq!(
        app.consume("transfer", "u", 600).await.status,
        StatusCode::OK
    );
    let denied = app.consume("transfer", "u", 600).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy(&denied.body, "transfers-per-day")["allowed"], true);
    assert_eq!(policy(&denied.body, "dollars-per-day")["allowed"], false);
    assert_eq!(
        policy(&denied.body, "transfers-per-day")["used"],
        1,
        "the passing policy was not charged"
    );
    let ok = app.consume("transfer", "u", 400).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(policy(&ok.body, "transfers-per-day")["used"], 2);
    assert_eq!(policy(&ok.body, "dollars-per-day")["used"], 1000);
    assert_eq!(
        app.consume("transfer", "u", 1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn shadow_policies_count_and_report_but_never_deny(counters: CounterBackend) {
    let mut shadow = calendar_policy("trial", "a", 1, "day", "UTC");
    shadow["mode"] = json!("shadow");
    let app = app_with(
        counters,
        &[shadow, calendar_policy("real", "a", 10, "day", "UTC")],
    )
    .await;
    app.consume("a", "s", 1).await;
    let second = app.consume("a", "s", 1).await;
    assert_eq!(second.status, StatusCode::OK);
    let trial = policy(&second.body, "trial");
    assert_eq!(
        (
            trial["allowed"].clone(),
            trial["used"].clone(),
            trial["mode"].clone()
        ),
        (json!(false), json!(2), json!("shadow"))
    );
    assert_eq!(policy(&second.body, "real")["used"], 2);
}

async fn check_answers_like_consume_and_charges_nothing(counters: CounterBackend) {
    let app = app_with(counters, &[calendar_policy("p", "a", 1, "day", "UTC")]).await;
    for _ in 0..3 {
        let check = app.check("a", "s", 1).await;
        assert_eq!(check.status, StatusCode::OK);
        assert_eq!(policy(&check.body, "p")["used"], 0);
        assert_eq!(check.body["consumption_id"], Value::Null);
    }
    assert_eq!(app.consume("a", "s", 1).await.status, StatusCode::OK);
    let denied = app.consume("a", "s", 1).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.body["consumption_id"],
        Value::Null,
        "a denial charged nothing: no id to refund"
    );
    let check = app.check("a", "s", 1).await;
    assert_eq!(check.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(check.header("retry-after").is_some());
    let usage = app.usage("a", "s").await;
    assert_eq!(usage.status, StatusCode::OK);
    assert_eq!(usage.body["action"], "a");
    assert_eq!(policy(&usage.body, "p")["used"], 1);
}

async fn overrides_replace_the_limit_until_they_expire(counters: CounterBackend) {
    let app = app_with(counters, &[calendar_policy("p", "a", 1, "day", "UTC")]).await;
    let put = |subject: &str, body: Value| {
        app.admin(
            Method::PUT,
            &format!("/admin/policies/p/overrides/{subject}"),
        )
        .json(&body)
    };
    app.send(put("vip", json!({"limit": 3}))).await;
    app.send(put(
        "lapsed",
        json!({"limit": 3, "expires_at": "2026-11-21T11:00:00Z"}),
    ))
    .await;
    for expected in [200, 200, 200, 429] {
        assert_eq!(app.consume("a", "vip", 1).await.status.as_u16(), expected);
    }
    assert_eq!(policy(&app.usage("a", "vip").await.body, "p")["limit"], 3);
    assert_eq!(app.consume("a", "lapsed", 1).await.status, StatusCode::OK);
    assert_eq!(
        app.consume("a", "lapsed", 1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(app.consume("a", "plain", 1).await.status, StatusCode::OK);
    assert_eq!(
        app.consume("a", "plain", 1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn a_new_limit_keeps_usage_but_a_new_window_starts_afresh(counters: CounterBackend) {
    let app = app_with(counters, &[calendar_policy("p", "a", 5, "day", "UTC")]).await;
    app.consume("a", "s", 1).await;
    app.consume("a", "s", 1).await;
    app.send(
        app.admin(Method::PUT, "/admin/policies/p")
            .json(&calendar_policy("p", "a", 3, "day", "UTC")),
    )
    .await;
    let usage = app.usage("a", "s").await;
    assert_eq!(
        (
            policy(&usage.body, "p")["used"].clone(),
            policy(&usage.body, "p")["remaining"].clone()
        ),
        (json!(2), json!(1))
    );
    app.send(
        app.admin(Method::PUT, "/admin/policies/p")
            .json(&calendar_policy("p", "a", 3, "week", "UTC")),
    )
    .await;
    assert_eq!(policy(&app.usage("a", "s").await.body, "p")["used"], 0);
}

async fn disabled_policies_are_ignored_and_unknown_actions_are_404(counters: CounterBackend) {
    let mut off = calendar_policy("off", "a", 0, "day", "UTC");
    off["enabled"] = json!(false);
    let app = app_with(
        counters,
        &[off, calendar_policy("on", "a", 5, "day", "UTC")],
    )
    .await;
    let answer = app.consume("a", "s", 1).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["policies"].as_array().map(Vec::len), Some(1));
    app.consume("nobody.limits.this", "s", 1)
        .await
        .assert_problem(404);
    app.usage("nobody.limits.this", "s")
        .await
        .assert_problem(404);
}

async fn invalid_consumes_are_422_and_charge_nothing(counters: CounterBackend) {
    let amount = json!({"id": "p", "action": "a", "measure": "amount", "limit": 100,
        "window": {"type": "calendar", "period": "day"}});
    let app = app_with(counters, &[amount]).await;
    let cases = [
        (
            json!({"action": "a", "subject": "", "amount": 1}),
            "subject",
        ),
        (
            json!({"action": "a", "subject": "tab\there", "amount": 1}),
            "subject",
        ),
        (
            json!({"action": "a", "subject": "x".repeat(257), "amount": 1}),
            "subject",
        ),
        (
            json!({"action": "a", "subject": "s", "amount": 0}),
            "amount",
        ),
        (
            json!({"action": "a", "subject": "s", "amount": -3}),
            "amount",
        ),
        (
            json!({"action": "a", "subject": "s", "amount": 9007199254740992_i64}),
            "amount",
        ),
        (
            json!({"action": "a", "subject": "s", "amount": 1.5}),
            "amount",
        ),
        (json!({"action": "A B", "subject": "s"}), "action"),
        (json!({"subject": "s"}), "action"),
    ];
    for (body, field) in cases {
        let answer = app.quota("/quota/consume", body.clone()).await;
        let problem = answer.assert_problem(422);
        assert!(
            problem["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["field"] == field),
            "{body}: {problem}"
        );
    }
    assert_eq!(policy(&app.usage("a", "s").await.body, "p")["used"], 0);
}

async fn the_ratelimit_fields_describe_the_most_constraining_policy(counters: CounterBackend) {
    let app = app_with(
        counters,
        &[
            calendar_policy("hourly", "a", 2, "hour", "UTC"),
            calendar_policy("daily", "a", 100, "day", "UTC"),
        ],
    )
    .await;
    let answer = app.consume("a", "s", 1).await;
    assert_eq!(
        answer.header("ratelimit-policy"),
        Some("\"hourly\";q=2;w=3600")
    );
    assert_eq!(answer.header("ratelimit"), Some("\"hourly\";r=1;t=3600"));
}

async fn subjects_with_braces_and_separators_are_counted_apart(counters: CounterBackend) {
    let app = app_with(counters, &[calendar_policy("p", "a", 1, "day", "UTC")]).await;
    for subject in ["a}b", "a%7Db", "{a}", "a|b", "a:b", "Zoë"] {
        assert_eq!(
            app.consume("a", subject, 1).await.status,
            StatusCode::OK,
            "{subject}"
        );
    }
}

on_counter_stores!(
    sms_per_day_resets_at_midnight_in_new_york,
    the_day_after_dst_ends_in_new_york_is_25_hours,
    dollars_per_rolling_day_are_counted_in_minor_units,
    a_token_bucket_allows_a_burst_then_refills_smoothly,
    all_policies_pass_and_are_charged_or_none_is,
    shadow_policies_count_and_report_but_never_deny,
    check_answers_like_consume_and_charges_nothing,
    overrides_replace_the_limit_until_they_expire,
    a_new_limit_keeps_usage_but_a_new_window_starts_afresh,
    disabled_policies_are_ignored_and_unknown_actions_are_404,
    invalid_consumes_are_422_and_charge_nothing,
    the_ratelimit_fields_describe_the_most_constraining_policy,
    subjects_with_braces_and_separators_are_counted_apart,
);
