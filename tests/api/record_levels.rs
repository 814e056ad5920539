//! Record levels over HTTP: a policy's `record`. A consume that charges only policies
//! recording `totals`, without an idempotency key, is answered without a consumption id,
//! is not listed by `GET /quota/ledger` and adds to `ledger_totals` (once, once drained);
//! any other consume writes an entry as before. Usage and `counters verify` agree with both,
//! on every counter store.

mod moves;

use crate::helpers::{app_with, CounterBackend, TestApp};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// A row of `ledger_totals`: policy, budget, amount, allowed, denied.
type Row = (String, String, i64, i64, i64);

fn daily(id: &str, action: &str, limit: u64, record: &str) -> Value {
    json!({"id": id, "action": action, "measure": "count", "limit": limit,
        "window": {"type": "calendar", "period": "day", "timezone": "UTC"}, "record": record})
}

/// Every row of `ledger_totals` of `app`'s ledger (SQLite), in key order, with the period
/// ends they name.
async fn totals(app: &TestApp) -> (Vec<Row>, Vec<DateTime<Utc>>) {
    app.engine.drain_ledger_now().await;
    let pool = sqlx::SqlitePool::connect(&app.settings.database_url)
        .await
        .unwrap();
    let rows: Vec<(String, String, DateTime<Utc>, i64, i64, i64)> = sqlx::query_as(
        "SELECT policy_id, budget, period_end, amount, allowed, denied FROM ledger_totals \
         ORDER BY policy_id, budget, period_end",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let ends = rows.iter().map(|r| r.2).collect();
    let rows = rows
        .into_iter()
        .map(|(p, b, _, amount, allowed, denied)| (p, b, amount, allowed, denied))
        .collect();
    (rows, ends)
}

/// The entries `GET /quota/ledger` lists for `subject`.
async fn listed(app: &TestApp, subject: &str) -> Vec<Value> {
    app.engine.drain_ledger_now().await;
    let page = app
        .admin_get(&format!("/quota/ledger?subject={subject}"))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.body["items"].as_array().cloned().unwrap_or_default()
}

async fn verify_finds_no_drift(app: &TestApp) {
    app.engine.drain_ledger_now().await;
    let verified = app.admin_get("/admin/counters/verify").await;
    assert_eq!(verified.status, StatusCode::OK, "{}", verified.body);
    assert_eq!(verified.body["drift"], json!([]), "{}", verified.body);
}

fn row(policy: &str, budget: &str, amount: i64, allowed: i64, denied: i64) -> Row {
    (policy.into(), budget.into(), amount, allowed, denied)
}

async fn consumes_of_totals_policies_add_to_the_totals_and_write_no_entry(
    counters: CounterBackend,
) {
    let app = app_with(counters, &[daily("sms-day", "sms", 3, "totals")]).await;
    let policy = app.admin_get("/admin/policies/sms-day").await;
    assert_eq!(policy.body["record"], json!("totals"), "{}", policy.body);

    for _ in 0..3 {
        let allowed = app.consume("sms", "alice", 1).await;
        assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.body);
        assert_eq!(
            allowed.body["consumption_id"],
            Value::Null,
            "{}",
            allowed.body
        );
    }
    let denied = app.consume("sms", "alice", 1).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
    assert_eq!(listed(&app, "alice").await, Vec::<Value>::new());

    // With an idempotency key the consume writes an entry, and adds nothing to the totals.
    let keyed = app
        .quota(
            "/quota/consume",
            json!({"action": "sms", "subject": "bob", "idempotency_key": "k-1"}),
        )
        .await;
    assert_eq!(keyed.status, StatusCode::OK, "{}", keyed.body);
    assert!(keyed.body["consumption_id"].is_string(), "{}", keyed.body);
    assert_eq!(listed(&app, "bob").await.len(), 1);

    let (rows, ends) = totals(&app).await;
    assert_eq!(rows, [row("sms-day", "alice", 3, 3, 1)]);
    let usage = app.usage("sms", "alice").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(3),
        "{}",
        usage.body
    );
    // The row's period is the day's: it ends when the usage resets.
    let resets: DateTime<Utc> = usage.body["policies"][0]["resets_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a reset time: {}", usage.body));
    assert_eq!(ends, [resets]);
    verify_finds_no_drift(&app).await;
}

async fn a_consume_charging_an_entries_policy_too_writes_one_entry_with_every_share(
    counters: CounterBackend,
) {
    let policies = [
        daily("pay-count", "pay", 10, "totals"),
        daily("pay-entries", "pay", 10, "entries"),
    ];
    let app = app_with(counters, &policies).await;
    let answer = app.consume("pay", "carol", 1).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(answer.body["consumption_id"].is_string(), "{}", answer.body);
    let entries = listed(&app, "carol").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let shares: Vec<&str> = entries[0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["policy_id"].as_str())
        .collect();
    assert_eq!(shares, ["pay-count", "pay-entries"], "{entries:?}");
    assert_eq!(
        totals(&app).await.0,
        Vec::<Row>::new(),
        "nothing counted twice"
    );
    verify_finds_no_drift(&app).await;
}

crate::on_counter_stores!(
    consumes_of_totals_policies_add_to_the_totals_and_write_no_entry,
    a_consume_charging_an_entries_policy_too_writes_one_entry_with_every_share,
);

#[tokio::test]
async fn a_token_bucket_cannot_record_totals() {
    let app = app_with(CounterBackend::Memory, &[]).await;
    let bucket = json!({"id": "tb", "action": "api", "measure": "count", "limit": 5,
        "window": {"type": "token_bucket", "seconds": 60}, "record": "totals"});
    let refused = app.create_policy(bucket).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.body
    );
    assert!(
        refused.body.to_string().contains("record"),
        "{}",
        refused.body
    );
    let policies = app.admin_get("/admin/policies").await;
    assert!(
        !policies.body.to_string().contains("\"tb\""),
        "{}",
        policies.body
    );
}

/// A consume answered 503 that Redis ran all the same is voided: the void takes back
/// what its entry added to the totals.
#[tokio::test]
async fn a_voided_consume_is_taken_out_of_the_totals() {
    let app = app_with(
        CounterBackend::Redis,
        &[daily("sms-day", "sms", 5, "totals")],
    )
    .await;
    assert_eq!(app.consume("sms", "dave", 1).await.status, StatusCode::OK);
    // Redis ran it; its answer was lost on the way back.
    app.engine.faults().arm("store.reply_lost");
    let lost = app.consume("sms", "dave", 1).await;
    app.engine.faults().clear();
    lost.assert_problem(503);
    let settled = app.engine.void_settled(true).await;
    assert_eq!(format!("{settled:?}"), "[Voided]");
    assert_eq!(totals(&app).await.0, [row("sms-day", "dave", 1, 1, 0)]);
    let usage = app.usage("sms", "dave").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(1),
        "{}",
        usage.body
    );
    verify_finds_no_drift(&app).await;
}

/// The embedded default rebuilds its counters at start from what the ledger holds, the
/// consumes recorded in totals included.
#[tokio::test]
async fn a_restart_keeps_the_usage_recorded_in_totals() {
    let app = app_with(
        CounterBackend::Memory,
        &[daily("sms-day", "sms", 5, "totals")],
    )
    .await;
    for _ in 0..2 {
        assert_eq!(app.consume("sms", "erin", 1).await.status, StatusCode::OK);
    }
    let app = app.crash_restart().await;
    let usage = app.usage("sms", "erin").await;
    assert_eq!(
        usage.body["policies"][0]["used"],
        json!(2),
        "{}",
        usage.body
    );
    assert_eq!(totals(&app).await.0, [row("sms-day", "erin", 2, 2, 0)]);
    verify_finds_no_drift(&app).await;
}

/// Backtests and `GET /quota/ledger` read entries: each says what it leaves out for a
/// policy that records totals (a backtest counts those requests apart, and replays only
/// the entries; the listing names the policies whose consumes it does not list).
#[tokio::test]
async fn backtests_and_the_ledger_listing_say_what_totals_leave_out() {
    let policies = [
        daily("sms-day", "sms", 3, "totals"),
        daily("pay-day", "pay", 3, "entries"),
    ];
    let app = app_with(CounterBackend::Memory, &policies).await;
    for _ in 0..4 {
        app.consume("sms", "frank", 1).await;
    }
    let keyed = app
        .quota(
            "/quota/consume",
            json!({"action": "sms", "subject": "gina", "idempotency_key": "k-2"}),
        )
        .await;
    assert_eq!(keyed.status, StatusCode::OK, "{}", keyed.body);

    let sms = app.admin_get("/quota/ledger?action=sms").await;
    assert_eq!(sms.status, StatusCode::OK, "{}", sms.body);
    assert_eq!(sms.body["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(sms.body["policies_recording_totals"], json!(["sms-day"]));
    let pay = app.admin_get("/quota/ledger?action=pay").await;
    assert_eq!(
        pay.body["policies_recording_totals"],
        json!([]),
        "{}",
        pay.body
    );
    let all = app.admin_get("/quota/ledger").await;
    assert_eq!(all.body["policies_recording_totals"], json!(["sms-day"]));

    let tried = json!({"policies": [{"id": "sms-try", "action": "sms", "measure": "count",
        "limit": 1, "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}],
        "days": 1});
    let answer = app
        .send(
            app.admin(reqwest::Method::POST, "/admin/backtest")
                .json(&tried),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let outcome = &answer.body["policies"][0];
    // The keyed consume is the one entry; the four others (three allowed, one denied)
    // are in the totals.
    assert_eq!(outcome["requests"], json!(1), "{}", answer.body);
    assert_eq!(outcome["in_totals"], json!(4), "{}", answer.body);
    assert_eq!(answer.body["entries"], json!(1), "{}", answer.body);
}

/// The embedded default folds the consumes recorded in totals that share a commit into a
/// few rows (`folded`): a burst of 300 over 30 subjects (a limit of 6 each: 180 allowed,
/// 120 denied) leaves fewer rows than consumes, standing for every one of them. The totals,
/// the hourly activity, a backtest's count and a restart's usage come out as they would
/// with a row per consume.
#[tokio::test]
async fn consumes_recorded_in_totals_that_share_a_commit_are_folded_into_few_rows() {
    let app = app_with(
        CounterBackend::Memory,
        &[daily("sms-day", "sms", 6, "totals")],
    )
    .await;
    burst(&app).await;

    let pool = sqlx::SqlitePool::connect(&app.settings.database_url)
        .await
        .unwrap();
    let kinds: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT kind, COUNT(*), CAST(SUM(COALESCE(folded, 1)) AS INTEGER), \
         CAST(SUM(folded IS NOT NULL) AS INTEGER) FROM ledger_entries GROUP BY kind ORDER BY kind",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let rows: i64 = kinds.iter().map(|k| k.1).sum();
    assert!(rows < 300, "{rows} rows for 300 consumes: {kinds:?}");
    assert!(kinds.iter().any(|k| k.3 > 0), "no folded row: {kinds:?}");
    let stands_for: Vec<(&str, i64)> = kinds.iter().map(|k| (k.0.as_str(), k.2)).collect();
    assert_eq!(stands_for, [("charge", 180), ("deny", 120)]);
    let hourly: (i64, i64) =
        sqlx::query_as("SELECT SUM(charges), SUM(denials) FROM ledger_hourly WHERE action = 'sms'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(hourly, (180, 120));

    let (rows, _) = totals(&app).await;
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(
        rows.iter().all(|r| (r.2, r.3, r.4) == (6, 6, 4)),
        "{rows:?}"
    );

    let tried = json!({"policies": [{"id": "sms-try", "action": "sms", "measure": "count",
        "limit": 1, "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}],
        "days": 1});
    let answer = app
        .send(
            app.admin(reqwest::Method::POST, "/admin/backtest")
                .json(&tried),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(
        answer.body["policies"][0]["in_totals"],
        json!(300),
        "{}",
        answer.body
    );
    verify_finds_no_drift(&app).await;

    let app = app.crash_restart().await;
    for i in 0..30 {
        let usage = app.usage("sms", &format!("s-{i}")).await;
        assert_eq!(
            usage.body["policies"][0]["used"],
            json!(6),
            "{}",
            usage.body
        );
    }
    verify_finds_no_drift(&app).await;
}

/// 300 consumes of `sms` at once over 30 subjects (a limit of 6 each: 180 allowed).
async fn burst(app: &TestApp) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let request = app
            .client
            .post(format!("{}/quota/consume", app.address))
            .json(&json!({"action": "sms", "subject": format!("s-{}", i % 30)}));
        tasks.spawn(async move { request.send().await.map(|r| r.status()) });
    }
    let mut allowed = 0;
    while let Some(status) = tasks.join_next().await {
        match status.expect("ran").expect("answered") {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(allowed, 180);
}
