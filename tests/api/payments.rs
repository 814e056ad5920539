//! Payment-grade consumes over real HTTP on both counter stores: idempotent retries,
//! refunds, holds, and the ledger entries they leave.

use crate::helpers::{app_with, calendar_policy, Answer, CounterBackend, TestApp};
use crate::on_counter_stores;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn dollars(limit: u64) -> Value {
    json!({"id": "dollars", "action": "transfer", "measure": "amount", "limit": limit,
        "window": {"type": "calendar", "period": "day"}})
}

fn used(answer: &Answer, policy: &str) -> Value {
    answer.body["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["policy_id"] == policy))
        .map_or(Value::Null, |p| p["used"].clone())
}

async fn consume_with_key(app: &TestApp, amount: u64, key: &str) -> Answer {
    app.quota(
        "/quota/consume",
        json!({"action": "transfer", "subject": "u", "amount": amount, "idempotency_key": key}),
    )
    .await
}

/// The ledger page for `query`, after moving whatever the Redis streams hold into SQL.
async fn ledger(app: &TestApp, query: &str) -> Vec<Value> {
    app.engine.drain_ledger_now().await;
    let answer = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?{query}", app.address)),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["items"].as_array().cloned().unwrap_or_default()
}

async fn a_retry_with_the_same_key_replays_the_answer_and_charges_once(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1000)]).await;
    let first = consume_with_key(&app, 300, "order-1").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    app.advance(60);
    let again = consume_with_key(&app, 300, "order-1").await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["replayed"], true);
    let mut expected = first.body.clone();
    expected["replayed"] = json!(true);
    assert_eq!(again.body, expected, "the original answer, marked replayed");
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 300);
    let other = consume_with_key(&app, 300, "order-2").await;
    assert_eq!(
        used(&other, "dollars"),
        600,
        "another key is another charge"
    );
}

async fn the_same_key_with_another_amount_is_a_conflict(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1000)]).await;
    assert_eq!(
        consume_with_key(&app, 300, "k").await.status,
        StatusCode::OK
    );
    consume_with_key(&app, 301, "k").await.assert_problem(409);
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 300);
}

async fn a_hundred_concurrent_retries_charge_once(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1_000_000)]).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let request = app.client.post(format!("{}/quota/consume", app.address)).json(
            &json!({"action": "transfer", "subject": "u", "amount": 250, "idempotency_key": "same"}),
        );
        tasks.spawn(async move { Answer::read(request.send().await.unwrap()).await });
    }
    let mut ids = std::collections::HashSet::new();
    let mut fresh = 0;
    while let Some(answer) = tasks.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        ids.insert(answer.body["consumption_id"].as_str().unwrap().to_owned());
        fresh += usize::from(answer.body["replayed"] == false);
    }
    assert_eq!(
        (ids.len(), fresh),
        (1, 1),
        "one charge, ninety-nine replays"
    );
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 250);
    let charges = ledger(&app, "subject=u&kind=charge").await;
    assert_eq!(charges.len(), 1, "one ledger entry");
}

async fn refunds_give_back_part_then_the_rest_and_never_more(counters: CounterBackend) {
    let app = app_with(
        counters,
        &[
            dollars(1000),
            calendar_policy("transfers", "transfer", 5, "day", "UTC"),
        ],
    )
    .await;
    let charge = app.consume("transfer", "u", 600).await;
    let id = charge.body["consumption_id"].as_str().unwrap().to_owned();

    let partial = app
        .quota(
            "/quota/refund",
            json!({"consumption_id": id, "amount": 200}),
        )
        .await;
    assert_eq!(partial.status, StatusCode::OK, "{}", partial.body);
    assert_eq!(partial.body["entry"]["kind"], "refund");
    assert_eq!(partial.body["entry"]["amount"], 200);
    assert_eq!(used(&partial, "dollars"), 400);
    assert_eq!(
        used(&partial, "transfers"),
        1,
        "a partial refund keeps the transfer counted"
    );

    let rest = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    assert_eq!(rest.body["entry"]["amount"], 400);
    assert_eq!(used(&rest, "dollars"), 0);
    assert_eq!(
        used(&rest, "transfers"),
        0,
        "a full refund gives the transfer back too"
    );

    app.quota("/quota/refund", json!({"consumption_id": id, "amount": 1}))
        .await
        .assert_problem(409);
    app.quota("/quota/refund", json!({"consumption_id": "no-such-id"}))
        .await
        .assert_problem(404);
    app.quota("/quota/refund", json!({"consumption_id": id, "amount": 0}))
        .await
        .assert_problem(422);
}

async fn a_refund_with_a_key_is_applied_once(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1000)]).await;
    let id = app.consume("transfer", "u", 600).await.body["consumption_id"].clone();
    let body = json!({"consumption_id": id, "amount": 100, "idempotency_key": "r1"});
    let first = app.quota("/quota/refund", body.clone()).await;
    let again = app.quota("/quota/refund", body).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["replayed"], true);
    assert_eq!(again.body["entry"], first.body["entry"]);
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 500);
    app.quota(
        "/quota/refund",
        json!({"consumption_id": id, "amount": 99, "idempotency_key": "r1"}),
    )
    .await
    .assert_problem(409);

    // A refund of the rest (no amount), retried with its key after it stood (its answer
    // lost, say): the same refund replayed, not "refunded in full already".
    let rest = json!({"consumption_id": id, "idempotency_key": "r2"});
    let first = app.quota("/quota/refund", rest.clone()).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(first.body["entry"]["amount"], 500);
    let again = app.quota("/quota/refund", rest).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["replayed"], true);
    assert_eq!(again.body["entry"], first.body["entry"]);
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 0);
    // Without a key, a refund of the rest after it stood is still a conflict.
    app.quota("/quota/refund", json!({"consumption_id": id}))
        .await
        .assert_problem(409);
}

async fn a_refund_after_the_period_ended_is_recorded_but_changes_no_usage(
    counters: CounterBackend,
) {
    let app = app_with(counters, &[dollars(1000)]).await;
    let id = app.consume("transfer", "u", 900).await.body["consumption_id"].clone();
    app.advance(24 * 3600);
    assert_eq!(
        used(&app.consume("transfer", "u", 700).await, "dollars"),
        700
    );
    let refund = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    assert_eq!(refund.body["entry"]["amount"], 900);
    assert_eq!(used(&refund, "dollars"), 700, "today's usage is untouched");
}

async fn a_hold_commits_less_than_it_held_and_gives_back_the_rest(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1000)]).await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 500, "ttl_seconds": 600}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    assert_eq!(used(&hold, "dollars"), 500);
    assert_eq!(hold.body["expires_at"], "2026-11-21T12:10:00Z");
    let id = hold.body["hold_id"].as_str().unwrap().to_owned();

    let commit = app
        .quota(&format!("/quota/holds/{id}/commit"), json!({"amount": 430}))
        .await;
    assert_eq!(commit.status, StatusCode::OK, "{}", commit.body);
    assert_eq!(commit.body["entry"]["kind"], "commit");
    assert_eq!(commit.body["entry"]["amount"], 430);
    assert_eq!(used(&commit, "dollars"), 430);
    app.quota(&format!("/quota/holds/{id}/commit"), json!({}))
        .await
        .assert_problem(409);
    app.send(
        app.client
            .post(format!("{}/quota/holds/{id}/release", app.address)),
    )
    .await
    .assert_problem(409);

    let denied = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 600, "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.body["hold_id"], Value::Null);
    let too_much = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 100, "ttl_seconds": 60}),
        )
        .await;
    let other = too_much.body["hold_id"].as_str().unwrap().to_owned();
    app.quota(
        &format!("/quota/holds/{other}/commit"),
        json!({"amount": 101}),
    )
    .await
    .assert_problem(409);
    app.send(
        app.client
            .post(format!("{}/quota/holds/nope.3/release", app.address)),
    )
    .await
    .assert_problem(404);
}

async fn a_released_hold_gives_everything_back(counters: CounterBackend) {
    let app = app_with(
        counters,
        &[
            dollars(1000),
            calendar_policy("transfers", "transfer", 5, "day", "UTC"),
        ],
    )
    .await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 500, "ttl_seconds": 60}),
        )
        .await;
    let id = hold.body["hold_id"].as_str().unwrap().to_owned();
    let release = app
        .send(
            app.client
                .post(format!("{}/quota/holds/{id}/release", app.address)),
        )
        .await;
    assert_eq!(release.status, StatusCode::OK, "{}", release.body);
    assert_eq!(release.body["entry"]["kind"], "release");
    assert_eq!(
        (used(&release, "dollars"), used(&release, "transfers")),
        (json!(0), json!(0))
    );
}

async fn an_unsettled_hold_is_released_when_it_expires(counters: CounterBackend) {
    let app = app_with(counters, &[dollars(1000)]).await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 500, "ttl_seconds": 5}),
        )
        .await;
    let id = hold.body["hold_id"].as_str().unwrap().to_owned();
    app.advance(6);
    // The background sweeper may get there first; either way the hold expires once.
    app.engine.expire_due_holds().await;
    let usage = used(&app.usage("transfer", "u").await, "dollars");
    assert_eq!(usage, 0, "the expired hold was released");
    app.quota(&format!("/quota/holds/{id}/commit"), json!({}))
        .await
        .assert_problem(409);
    let expired = ledger(&app, "subject=u&kind=expire").await;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0]["hold_id"], id.as_str());
}

async fn the_ledger_records_every_step_newest_first(counters: CounterBackend) {
    let mut strict = dollars(1000);
    strict["ledger_denials"] = json!(true);
    let app = app_with(counters, &[strict]).await;
    let id = app.consume("transfer", "u", 600).await.body["consumption_id"].clone();
    assert_eq!(
        app.consume("transfer", "u", 600).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.quota(
        "/quota/refund",
        json!({"consumption_id": id, "amount": 100}),
    )
    .await;
    let items = ledger(&app, "subject=u").await;
    let kinds: Vec<&str> = items.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["refund", "deny", "charge"]);
    assert_eq!(items[2]["consumption_id"], id);
    assert_eq!(
        items[2]["policies"],
        json!([{"policy_id": "dollars", "amount": 600, "budget": {"subject": "u"}}])
    );
    assert!(
        items[2].get("detail").is_none(),
        "internal detail is not exposed"
    );
}

on_counter_stores!(
    a_retry_with_the_same_key_replays_the_answer_and_charges_once,
    the_same_key_with_another_amount_is_a_conflict,
    a_hundred_concurrent_retries_charge_once,
    refunds_give_back_part_then_the_rest_and_never_more,
    a_refund_with_a_key_is_applied_once,
    a_refund_after_the_period_ended_is_recorded_but_changes_no_usage,
    a_hold_commits_less_than_it_held_and_gives_back_the_rest,
    a_released_hold_gives_everything_back,
    an_unsettled_hold_is_released_when_it_expires,
    the_ledger_records_every_step_newest_first,
);

/// A hold record that no longer parses is a server error, never taken for an unknown
/// hold: that would drop it and keep its quota charged for good (Redis: the record is
/// overwritten there; the memory store keeps its records out of reach).
#[tokio::test]
async fn a_corrupt_hold_record_is_an_error_and_keeps_the_hold() {
    let app = app_with(CounterBackend::Redis, &[dollars(1000)]).await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "transfer", "subject": "u", "amount": 500, "ttl_seconds": 5}),
        )
        .await;
    let id = hold.body["hold_id"].as_str().unwrap().to_owned();
    let hold_id = quota_ledger::domain::HoldId::parse(&id).unwrap();
    let key = quota_ledger::keys::hold_record(&app.settings.redis_prefix, hold_id.shard(), &id);
    let client = redis::Client::open(app.settings.redis_urls[0].as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("open\n{not json")
        .query_async(&mut conn)
        .await
        .unwrap();

    let commit = app
        .quota(&format!("/quota/holds/{id}/commit"), json!({}))
        .await;
    commit.assert_problem(500);
    app.advance(6);
    assert_eq!(app.engine.expire_due_holds().await, 0);
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 500);
    let member: Option<f64> = redis::cmd("ZSCORE")
        .arg(quota_ledger::keys::holds_index(
            &app.settings.redis_prefix,
            hold_id.shard(),
        ))
        .arg(&id)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(member.is_some(), "the hold stays indexed, for an operator");
}

/// A refund of a charge whose entry waits in a ledger stream that cannot be moved into
/// SQL (the insert fails) is 503, not "no consumption": the charge exists, in Redis. Once
/// the drain works again, the refund is served.
#[tokio::test]
async fn a_refund_whose_charge_waits_in_a_stream_that_cannot_be_drained_is_503() {
    let app = app_with(CounterBackend::Redis, &[dollars(1000)]).await;
    app.engine.faults().arm("drain.insert");
    let charged = app.consume("transfer", "u", 300).await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    let id = charged.body["consumption_id"].clone();

    let refused = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    let problem = refused.assert_problem(503);
    assert!(
        problem["detail"].as_str().unwrap().contains("ledger store"),
        "{problem}"
    );
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 300);

    app.engine.faults().clear();
    let refunded = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.body);
    assert_eq!(used(&app.usage("transfer", "u").await, "dollars"), 0);
}
