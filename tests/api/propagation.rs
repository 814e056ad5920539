//! A change made through one instance is enforced by every instance within a second
//! (Postgres: notifications and polling; SQLite: polling), and a Postgres outage leaves
//! consumes working from the cache and admin writes failing fast until it returns.

use crate::helpers::{
    calendar_policy, eventually, fresh_settings, spawn_app, spawn_with, CounterBackend,
    PolicyBackend, PrivatePostgres, TestApp,
};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::future::Future;
use std::time::{Duration, Instant};

/// How soon another instance must enforce a change.
const WITHIN: Duration = Duration::from_secs(1);

/// Asserts that `condition` (another instance's view of a change) holds within [`WITHIN`].
async fn propagates<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    // Poll a little past the deadline, so that a slow propagation reads as "took 1.3 s".
    eventually(5 * WITHIN, what, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await;
    let took = started.elapsed();
    assert!(took < WITHIN, "{what} took {took:?}, more than {WITHIN:?}");
}

async fn put(app: &TestApp, path: &str, body: serde_json::Value) -> StatusCode {
    app.send(app.admin(Method::PUT, path).json(&body))
        .await
        .status
}

/// Creates, lowers, overrides and deletes a policy through `a`; `b` follows each step.
async fn every_kind_of_change_reaches(a: &TestApp, b: &TestApp) {
    assert_eq!(
        b.check("sms.send", "u", 1).await.status,
        StatusCode::NOT_FOUND
    );

    a.must_create_policy(calendar_policy("sms", "sms.send", 5, "day", "UTC"))
        .await;
    propagates("a new policy", || async {
        b.check("sms.send", "u", 1).await.status == StatusCode::OK
    })
    .await;
    for _ in 0..3 {
        assert_eq!(b.consume("sms.send", "u", 1).await.status, StatusCode::OK);
    }

    let lowered = calendar_policy("sms", "sms.send", 3, "day", "UTC");
    assert_eq!(put(a, "/admin/policies/sms", lowered).await, StatusCode::OK);
    propagates("a lowered limit", || async {
        b.check("sms.send", "u", 1).await.status == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
    let denied = b.consume("sms.send", "u", 1).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
    assert_eq!(denied.body["policies"][0]["limit"], 3);

    let path = "/admin/policies/sms/overrides/u";
    assert_eq!(
        put(a, path, json!({"limit": 10})).await,
        StatusCode::CREATED
    );
    propagates("an override", || async {
        b.check("sms.send", "u", 1).await.status == StatusCode::OK
    })
    .await;
    let allowed = b.consume("sms.send", "u", 1).await;
    assert_eq!(allowed.body["policies"][0]["limit"], 10, "{}", allowed.body);
    assert_eq!(allowed.body["policies"][0]["used"], 4);

    let deleted = a.send(a.admin(Method::DELETE, "/admin/policies/sms")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    propagates("a deletion", || async {
        b.consume("sms.send", "u", 1).await.status == StatusCode::NOT_FOUND
    })
    .await;
}

async fn a_change_made_through_one_instance_is_enforced_by_another_within_a_second(
    store: PolicyBackend,
) {
    let a = spawn_app(store, CounterBackend::Redis).await;
    let b = spawn_with(a.settings.clone()).await;
    every_kind_of_change_reaches(&a, &b).await;
}

crate::on_policy_stores!(a_change_made_through_one_instance_is_enforced_by_another_within_a_second);

#[tokio::test]
async fn on_postgres_notifications_alone_carry_every_change_within_a_second() {
    let a = spawn_app(PolicyBackend::Postgres, CounterBackend::Redis).await;
    let mut settings = a.settings.clone();
    // B never polls during the test: only the notifications can tell it.
    settings.policy_poll = Duration::from_secs(3_600);
    let b = spawn_with(settings).await;
    every_kind_of_change_reaches(&a, &b).await;
}

#[tokio::test]
async fn with_sqlite_an_instance_polling_once_an_hour_keeps_its_view_meanwhile() {
    let a = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let mut settings = a.settings.clone();
    settings.policy_poll = Duration::from_secs(3_600);
    let b = spawn_with(settings).await;
    a.must_create_policy(calendar_policy("p", "a", 5, "day", "UTC"))
        .await;
    // SQLite announces nothing, and B does not poll during the test, so its cache keeps
    // the old view: the interval is honoured, and polling is what the SQLite test relies on.
    let started = Instant::now();
    while started.elapsed() < WITHIN {
        assert_eq!(b.check("a", "s", 1).await.status, StatusCode::NOT_FOUND);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn policy_store_status(app: &TestApp) -> (StatusCode, serde_json::Value) {
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    (ready.status, ready.body["stores"]["policy_store"].clone())
}

#[tokio::test]
async fn while_postgres_is_down_consumes_go_on_admin_writes_fail_fast_and_all_recovers() {
    let postgres = PrivatePostgres::start().await;
    // Fresh settings (Redis prefix, tokens) with the policy store on the private server.
    // Counters in Redis, as in production: the ledger entries of the consumes made while
    // Postgres is down wait in the Redis streams. (With the embedded counters the ledger is
    // written to the database before answering, so consumes fail closed instead.)
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.database_url = postgres.url.clone();
    let a = spawn_with(settings.clone()).await;
    let b = spawn_with(settings).await;
    a.must_create_policy(calendar_policy("p", "a", 100, "day", "UTC"))
        .await;
    propagates("the policy", || async {
        b.check("a", "s", 1).await.status == StatusCode::OK
    })
    .await;

    postgres.stop().await;
    for app in [&a, &b] {
        let answer = app.consume("a", "s", 1).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "from the cache: {}",
            answer.body
        );
    }
    let started = Instant::now();
    let answer = a
        .create_policy(calendar_policy("q", "b", 5, "day", "UTC"))
        .await;
    answer.assert_problem(503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the write must not hang"
    );
    let started = Instant::now();
    let (status, policy_store) = policy_store_status(&a).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "readiness must not hang"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(policy_store, "down");
    assert_eq!(a.consume("a", "s", 1).await.status, StatusCode::OK);

    postgres.restart().await;
    eventually(
        Duration::from_secs(20),
        "admin writes work again",
        || async {
            let answer = a
                .create_policy(calendar_policy("q", "b", 5, "day", "UTC"))
                .await;
            (answer.status == StatusCode::CREATED).then_some(())
        },
    )
    .await;
    assert_eq!(policy_store_status(&a).await, (StatusCode::OK, json!("ok")));
    // Right after an outage B may still be reconnecting, so allow it more than a second.
    eventually(
        5 * WITHIN,
        "B enforces a change made after the outage",
        || async { (b.check("b", "s", 1).await.status == StatusCode::OK).then_some(()) },
    )
    .await;
    // The three consumes answered while Postgres was down reach the ledger once it is back.
    eventually(
        Duration::from_secs(10),
        "the outage's consumes are in the ledger",
        || async {
            let page = a
                .send(
                    a.client
                        .get(format!("{}/quota/ledger?subject=s&kind=charge", a.address)),
                )
                .await;
            (page.body["items"].as_array().map(Vec::len) == Some(3)).then_some(())
        },
    )
    .await;
}
