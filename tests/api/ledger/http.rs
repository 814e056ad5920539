//! `GET /quota/ledger` over HTTP: shape, filters, paging and validation.

use super::{entry, entry_id, hold_id, label};
use crate::helpers::{
    fresh_settings, spawn_app, spawn_with, Answer, CounterBackend, PolicyBackend, TestApp,
};
use crate::on_policy_stores;
use quota_ledger::config::Secret;
use quota_ledger::domain::{Action, EntryId, EntryKind, IdempotencyKey, LedgerEntry};
use quota_ledger::engine::ledger::LedgerStore;
use serde_json::{json, Value};
use std::sync::Arc;

/// An app, and a ledger store on its database to seed entries with.
async fn app_with_ledger(backend: PolicyBackend) -> (TestApp, Arc<dyn LedgerStore>) {
    let app = spawn_app(backend, CounterBackend::Memory).await;
    let ledger = quota_ledger::ledger::sql::connect(&app.settings.database_url)
        .await
        .unwrap();
    (app, ledger)
}

async fn get_ledger(app: &TestApp, query: &[(&str, &str)]) -> Answer {
    app.send(
        app.client
            .get(format!("{}/quota/ledger", app.address))
            .query(query),
    )
    .await
}

/// The labels of the ids of the answer's items.
fn item_ids(answer: &Answer) -> Vec<String> {
    answer.body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items in {}", answer.body))
        .iter()
        .map(|item| label(&EntryId::parse(item["id"].as_str().unwrap()).unwrap()))
        .collect()
}

async fn the_ledger_answers_newest_first_with_the_public_fields_only(backend: PolicyBackend) {
    let (app, ledger) = app_with_ledger(backend).await;
    let hold = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Hold,
        consumption_id: None,
        hold_id: Some(hold_id("h-1")),
        idempotency_key: Some(IdempotencyKey::parse("key-1").unwrap()),
        action: Action::parse("action", "sms.send").unwrap(),
        ..entry("hold", "bob", 120)
    };
    let refund = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Refund,
        amount: 200,
        ..entry("refund", "alice", 60)
    };
    ledger
        .append(&[entry("charge", "alice", 0), refund, hold])
        .await
        .unwrap();

    let answer = get_ledger(&app, &[]).await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
    assert_eq!(item_ids(&answer), ["hold", "refund", "charge"]);
    assert_eq!(answer.body["next_cursor"], Value::Null);
    assert_eq!(
        answer.body["items"][0],
        json!({"id": entry_id("hold").to_string(), "at": "2026-11-21T12:02:00Z", "kind": "hold",
               "action": "sms.send", "subject": "bob", "amount": 500, "consumption_id": null,
               "hold_id": hold_id("h-1").to_string(),
               "idempotency_key": "key-1",
               "policies": [{"policy_id": "transfer-daily", "amount": 500,
                             "budget": {"subject": "bob"}}],
               "over_captured": false,
               "attributes": {}}),
        "every public field, and never the internal detail"
    );

    for (query, expected) in [
        (vec![("subject", "alice")], vec!["refund", "charge"]),
        (vec![("action", "sms.send")], vec!["hold"]),
        (vec![("kind", "refund")], vec!["refund"]),
        (vec![("kind", "deny")], vec![]),
        (
            vec![("from", "2026-11-21T12:01:00Z")],
            vec!["hold", "refund"],
        ),
        (vec![("to", "2026-11-21T07:01:00-05:00")], vec!["charge"]),
        (
            vec![
                ("subject", "alice"),
                ("kind", "charge"),
                ("from", "2026-11-21T11:00:00Z"),
                ("to", "2026-11-21T13:00:00Z"),
            ],
            vec!["charge"],
        ),
    ] {
        let answer = get_ledger(&app, &query).await;
        assert_eq!(answer.status.as_u16(), 200, "{query:?}: {}", answer.body);
        assert_eq!(item_ids(&answer), expected, "{query:?}");
    }
}

async fn next_cursor_walks_the_ledger_page_by_page(backend: PolicyBackend) {
    let (app, ledger) = app_with_ledger(backend).await;
    let entries: Vec<_> = (1..=5)
        .map(|i| entry(&format!("e{i}"), "alice", i))
        .collect();
    ledger.append(&entries).await.unwrap();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("limit", "2")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor));
        }
        let answer = get_ledger(&app, &query).await;
        assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
        pages.push(item_ids(&answer).join(","));
        match answer.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, ["e5,e4", "e3,e2", "e1"]);
}

async fn invalid_ledger_queries_are_422_naming_the_field(backend: PolicyBackend) {
    let (app, _) = app_with_ledger(backend).await;
    for (name, value) in [
        ("limit", "0"),
        ("limit", "1001"),
        ("limit", "ten"),
        ("kind", "charges"),
        ("from", "yesterday"),
        ("to", "2026-11-21"),
        ("action", "Not An Action"),
        ("subject", ""),
        ("cursor", "not-a-cursor"),
        ("cursor", "s1.zz"),
    ] {
        let answer = get_ledger(&app, &[(name, value)]).await;
        let problem = answer.assert_problem(422);
        assert_eq!(
            problem["errors"][0]["field"], name,
            "{name}={value}: {problem}"
        );
    }
    let answer = get_ledger(&app, &[("limit", "1000")]).await;
    assert_eq!(answer.status.as_u16(), 200, "1000 is the largest page");
}

async fn unknown_ledger_query_parameters_are_refused(backend: PolicyBackend) {
    let (app, _) = app_with_ledger(backend).await;
    // A misspelt filter must not silently list everything.
    let answer = get_ledger(&app, &[("subjet", "alice")]).await;
    let problem = answer.assert_problem(400);
    assert!(
        problem["detail"].as_str().unwrap().contains("subjet"),
        "{problem}"
    );
}

async fn the_ledger_needs_a_client_token_when_tokens_are_set(backend: PolicyBackend) {
    let mut settings = fresh_settings(backend, CounterBackend::Memory).await;
    settings.client_tokens = vec![Secret::new("client-1")];
    let app = spawn_with(settings).await;
    get_ledger(&app, &[]).await.assert_problem(401);
    let url = format!("{}/quota/ledger", app.address);
    let wrong = app.send(app.client.get(&url).bearer_auth("client-2")).await;
    wrong.assert_problem(401);
    let right = app.send(app.client.get(&url).bearer_auth("client-1")).await;
    assert_eq!(right.status.as_u16(), 200, "{}", right.body);
    assert_eq!(
        right.body,
        json!({"items": [], "next_cursor": null, "policies_recording_totals": []})
    );
    // The admin token reads it too (the operator console signs in with it)...
    let admin = app
        .send(app.admin(reqwest::Method::GET, "/quota/ledger"))
        .await;
    assert_eq!(admin.status.as_u16(), 200, "{}", admin.body);
    // ...but consumes nothing: consuming stays the client tokens'.
    let consume = app.send(
        app.admin(reqwest::Method::POST, "/quota/consume")
            .json(&json!({"action": "sms", "subject": "u"})),
    );
    consume.await.assert_problem(401);
}

on_policy_stores!(
    the_ledger_answers_newest_first_with_the_public_fields_only,
    next_cursor_walks_the_ledger_page_by_page,
    invalid_ledger_queries_are_422_naming_the_field,
    unknown_ledger_query_parameters_are_refused,
    the_ledger_needs_a_client_token_when_tokens_are_set,
);
