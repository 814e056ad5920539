//! The outage budget: while Postgres is down, ledger entries wait in the Redis streams, and
//! `QUOTA_LEDGER_BACKLOG_MAX` bounds them. Past it consumes are answered 503
//! ledger-backlog-full (whatever `QUOTA_ON_STORE_ERROR` says) and charge nothing; once
//! Postgres is back the backlog drains, consumes are served again, and every allowed
//! consume is in SQL exactly once.

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, CounterBackend, PolicyBackend, PrivatePostgres,
    TestApp,
};
use quota_ledger::engine::OnStoreError;
use quota_ledger::keys::{ledger_stream, SHARDS};
use reqwest::StatusCode;
use std::collections::BTreeSet;

/// The bound of these tests.
const MAX: u64 = 5;

/// The `e` field of every entry waiting in the app's ledger streams.
async fn waiting_entries(app: &TestApp) -> Vec<String> {
    let url = app.settings.redis_urls[0].as_str();
    let mut redis = redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test Redis");
    let mut entries = Vec::new();
    for shard in 0..SHARDS {
        let stream = ledger_stream(&app.settings.redis_prefix, shard);
        let range: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut redis)
            .await
            .expect("XRANGE");
        for (_, fields) in range {
            entries.extend(fields.into_iter().filter(|(f, _)| f == "e").map(|(_, v)| v));
        }
    }
    entries
}

/// The consumption ids of the charges the SQL ledger holds for `subject`, with repeats.
async fn charges_in_sql(postgres: &PrivatePostgres, subject: &str) -> Vec<String> {
    let pool = sqlx::PgPool::connect(&postgres.url)
        .await
        .expect("connecting to the private Postgres");
    let ids: Vec<(String,)> = sqlx::query_as(
        "SELECT consumption_id FROM ledger_entries WHERE subject = $1 AND kind = 'charge'",
    )
    .bind(subject)
    .fetch_all(&pool)
    .await
    .expect("reading the ledger");
    ids.into_iter().map(|(id,)| id).collect()
}

#[tokio::test]
async fn past_the_backlog_bound_consumes_are_refused_uncharged_and_served_again_once_it_drains() {
    let postgres = PrivatePostgres::start().await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.database_url = postgres.url.clone();
    settings.ledger_backlog_max = MAX;
    // Fail-open must not open this: a charge may never exist without its ledger entry.
    settings.on_store_error = OnStoreError::Allow;
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "sms", 100, "day", "UTC"))
        .await;

    postgres.stop().await;
    let mut allowed = BTreeSet::new();
    for _ in 0..MAX {
        let answer = app.consume("sms", "u1", 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        allowed.insert(answer.body["consumption_id"].as_str().unwrap().to_owned());
    }
    let waiting = waiting_entries(&app).await;
    assert_eq!(
        waiting.len() as u64,
        MAX,
        "every allowed consume waits in Redis"
    );
    for entry in &waiting {
        assert!(entry.len() <= 200, "{} bytes: {entry:?}", entry.len());
    }

    // At the bound: refused at once, and nothing is charged.
    for _ in 0..3 {
        let refused = app.consume("sms", "u1", 1).await;
        let problem = refused.assert_problem(503);
        assert_eq!(
            problem["type"], "urn:quota-ledger:problem:ledger-backlog-full",
            "{problem}"
        );
        assert!(refused.header("retry-after").is_some());
    }
    // A measure agrees, and the state shows in readiness and metrics.
    assert_eq!(app.engine.measure_backlog().await, Some(MAX));
    assert_eq!(app.consume("sms", "u1", 1).await.status, 503);
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        ready.body["stores"]["ledger_backlog"], "full",
        "{}",
        ready.body
    );
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(&format!("quota_ledger_backlog_entries {MAX}\n")),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("quota_ledger_backlog_max_entries {MAX}\n")));
    assert_eq!(
        app.check("sms", "u1", 1).await.body["policies"][0]["used"],
        MAX
    );
    assert_eq!(waiting_entries(&app).await.len() as u64, MAX);

    // Postgres returns: the drain empties the backlog, and consumes are served again.
    postgres.restart().await;
    crate::helpers::eventually(
        std::time::Duration::from_secs(20),
        "the backlog drains into the restarted Postgres",
        || async {
            app.engine.drain_ledger_now().await;
            (app.engine.measure_backlog().await == Some(0)).then_some(())
        },
    )
    .await;
    let answer = app.consume("sms", "u1", 1).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    allowed.insert(answer.body["consumption_id"].as_str().unwrap().to_owned());
    app.engine.drain_ledger_now().await;
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(
        ready.body["stores"]["ledger_backlog"], "ok",
        "{}",
        ready.body
    );

    // Every allowed consume is in SQL exactly once, and nothing else is.
    let in_sql = charges_in_sql(&postgres, "u1").await;
    assert_eq!(in_sql.len(), allowed.len(), "{in_sql:?}");
    assert_eq!(in_sql.into_iter().collect::<BTreeSet<_>>(), allowed);
    assert_eq!(
        app.check("sms", "u1", 1).await.body["policies"][0]["used"],
        MAX + 1
    );
}
