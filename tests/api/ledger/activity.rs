//! `GET /admin/activity` over HTTP: the ledger per action and hour, and the most-denied
//! subjects, on SQLite and Postgres.

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_app, start_instant, CounterBackend, PolicyBackend,
    TestApp,
};
use crate::on_policy_stores;
use reqwest::Method;
use serde_json::{json, Value};

async fn activity(app: &TestApp, query: &str) -> crate::helpers::Answer {
    app.send(app.admin(Method::GET, &format!("/admin/activity{query}")))
        .await
}

/// The `(charges, amount, denials)` of each hour of `action` in `body`.
fn hours_of(body: &Value, action: &str) -> Vec<(u64, u64, u64)> {
    let actions = body["actions"].as_array().expect("actions");
    let found = actions
        .iter()
        .find(|a| a["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {body}"));
    found["hours"]
        .as_array()
        .expect("hours")
        .iter()
        .map(|h| {
            let n = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
            (n("charges"), n("amount"), n("denials"))
        })
        .collect()
}

async fn activity_counts_charges_amounts_and_denials_per_action_and_hour(backend: PolicyBackend) {
    let app = spawn_app(backend, CounterBackend::Memory).await;
    let mut sms = calendar_policy("sms-daily", "sms", 2, "day", "UTC");
    sms["ledger_denials"] = json!(true);
    app.must_create_policy(sms).await;
    let mut transfer = calendar_policy("transfer-daily", "transfer", 100_000, "day", "UTC");
    transfer["measure"] = json!("amount");
    app.must_create_policy(transfer).await;

    // 12:00-12:59 (the fake clock's start hour): two SMS allowed, one denied; a transfer.
    for _ in 0..3 {
        app.consume("sms", "alice", 1).await;
    }
    assert_eq!(app.consume("transfer", "alice", 25_000).await.status, 200);
    // 13:00: bob is denied twice (alice is at her limit, bob's first two pass).
    app.advance(3_600);
    for _ in 0..4 {
        app.consume("sms", "bob", 1).await;
    }

    let answer = activity(&app, "?hours=3").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = &answer.body;
    assert_eq!(body["from"], "2026-11-21T11:00:00Z", "{body}");
    assert_eq!(body["to"], "2026-11-21T14:00:00Z", "{body}");
    assert_eq!(body["hours"], 3);
    assert_eq!(hours_of(body, "sms"), [(0, 0, 0), (2, 2, 1), (2, 2, 2)]);
    assert_eq!(
        hours_of(body, "transfer"),
        [(0, 0, 0), (1, 25_000, 0), (0, 0, 0)]
    );
    assert_eq!(
        body["actions"][0]["hours"][1]["hour"], "2026-11-21T12:00:00Z",
        "{body}"
    );
    assert_eq!(
        body["top_denied"],
        json!([{"action": "sms", "subject": "bob", "denials": 2},
               {"action": "sms", "subject": "alice", "denials": 1}])
    );

    // One action only; one hour only (the current one).
    let only = activity(&app, "?action=transfer").await;
    assert_eq!(
        only.body["actions"].as_array().map(Vec::len),
        Some(1),
        "{}",
        only.body
    );
    assert_eq!(only.body["hours"], 24);
    assert_eq!(only.body["top_denied"], json!([]));
    let now = activity(&app, "?hours=1").await;
    assert_eq!(hours_of(&now.body, "sms"), [(2, 2, 2)]);
}

async fn activity_needs_the_admin_token_and_valid_parameters(backend: PolicyBackend) {
    let app = spawn_app(backend, CounterBackend::Memory).await;
    let url = format!("{}/admin/activity", app.address);
    app.send(app.client.get(&url)).await.assert_problem(401);
    let bad = activity(&app, "?hours=0&action=Not%20One").await;
    let problem = bad.assert_problem(422);
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(fields, ["hours", "action"], "{problem}");
    activity(&app, "?days=1").await.assert_problem(400);
    let empty = activity(&app, "").await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body["actions"], json!([]));
}

/// The hourly rollups count what an insert really added: a batch inserted again (a drain's
/// retry after an unknown commit) adds nothing, and a batch with new and old entries adds
/// only the new ones; retention removes the hours it has wholly passed.
async fn the_rollups_count_each_entry_once(backend: PolicyBackend) {
    let (ledger, _settings) = super::ledger_on(backend).await;
    let batch: Vec<_> = (0..3)
        .map(|i| super::entry(&format!("r{i}"), "alice", i * 60))
        .collect();
    let hour =
        |at: chrono::DateTime<chrono::Utc>| at - chrono::Duration::seconds(at.timestamp() % 3_600);
    let (from, to) = (
        hour(start_instant()),
        hour(start_instant()) + chrono::Duration::hours(1),
    );
    let totals = || async {
        let hours = ledger.activity(from, to, None).await.unwrap();
        hours
            .iter()
            .map(|h| (h.charges, h.amount))
            .collect::<Vec<_>>()
    };
    assert_eq!(ledger.append(&batch).await.unwrap(), 3);
    assert_eq!(totals().await, [(3, 1_500)]);
    assert_eq!(ledger.append(&batch).await.unwrap(), 0);
    assert_eq!(totals().await, [(3, 1_500)]);
    let mut more = batch.clone();
    more.push(super::entry("r3", "bob", 240));
    assert_eq!(ledger.append(&more).await.unwrap(), 1);
    assert_eq!(totals().await, [(4, 2_000)]);
    // Retention up to the next midnight (a partitioned ledger drops whole days): the
    // entries and their hour go.
    let midnight = (start_instant() + chrono::Duration::days(1))
        .date_naive()
        .and_time(chrono::NaiveTime::MIN)
        .and_utc();
    assert_eq!(ledger.delete_older_than(midnight, 100).await.unwrap(), 4);
    assert_eq!(totals().await, []);
}

/// Two drains appending at once on Postgres, their batches meeting the same hours and
/// actions in opposite orders: inserted over several statements, each locking its own
/// hours' rollups, they deadlocked (and one batch failed); an append is one statement now,
/// which locks them in key order.
#[tokio::test]
async fn concurrent_appends_never_deadlock_on_the_rollups_on_postgres() {
    let (ledger, _settings) = super::ledger_on(PolicyBackend::Postgres).await;
    let action = |name: &str| quota_ledger::domain::Action::parse("action", name).unwrap();
    let batch = |round: usize, first: &str, second: &str| -> Vec<_> {
        (0..1_200)
            .map(|i| {
                let mut entry = super::entry(&format!("{round}{first}{i}"), "alice", 0);
                entry.action = action(if i < 600 { first } else { second });
                entry
            })
            .collect()
    };
    for round in 0..5 {
        let (one, two) = (batch(round, "bb", "aa"), batch(round, "aa", "bb"));
        let (a, b) = tokio::join!(ledger.append(&one), ledger.append(&two));
        assert_eq!((a.unwrap(), b.unwrap()), (1_200, 1_200), "round {round}");
    }
}

on_policy_stores!(
    activity_counts_charges_amounts_and_denials_per_action_and_hour,
    activity_needs_the_admin_token_and_valid_parameters,
    the_rollups_count_each_entry_once,
);

/// On Postgres too, both statements read their rollup through its primary key, a range
/// of hours: with sequential scans ruled out, the plan names it (on tables this small
/// the planner would rightly scan them otherwise).
#[tokio::test]
async fn activity_searches_the_rollups_by_hour_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    quota_ledger::db::migrate_url(&settings.database_url)
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let mut connection = pool.acquire().await.unwrap();
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *connection)
        .await
        .unwrap();
    let (first, end) = quota_ledger::ledger::activity::hours(
        start_instant(),
        start_instant() + chrono::Duration::hours(24),
    );
    let [hourly, top] = quota_ledger::ledger::activity::statements();
    let explain = |sql: &str| format!("EXPLAIN {sql}");
    let hourly_plan: Vec<String> = sqlx::query_scalar(&explain(&hourly))
        .bind(first)
        .bind(end)
        .fetch_all(&mut *connection)
        .await
        .unwrap();
    let top_plan: Vec<String> = sqlx::query_scalar(&explain(&top))
        .bind(first)
        .bind(end)
        .bind(10_i64)
        .fetch_all(&mut *connection)
        .await
        .unwrap();
    for (plan, index) in [
        (hourly_plan, "ledger_hourly_pkey"),
        (top_plan, "ledger_hourly_denials_pkey"),
    ] {
        assert!(plan.iter().any(|line| line.contains(index)), "{plan:#?}");
        assert!(
            !plan.iter().any(|line| line.contains("ledger_entries")),
            "{plan:#?}"
        );
    }
}
