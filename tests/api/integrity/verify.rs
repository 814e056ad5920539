//! `counters verify`: the live counters equal the ledger's replay, whatever the window,
//! while traffic flows too; a ledger row deleted by hand shows as drift.

use super::refusal::Refusal;
use super::{assert_no_drift, cli_verify, verify};
use crate::helpers::{spawn_app, CounterBackend, PolicyBackend, TestApp};
use crate::on_policy_stores;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::Connection;

/// One policy of each window on the action `pay`, amounts or counts.
fn policies() -> Vec<Value> {
    vec![
        json!({"id": "day", "action": "pay", "measure": "amount", "limit": 1_000_000,
            "window": {"type": "calendar", "period": "day", "timezone": "Europe/Berlin"}}),
        json!({"id": "local-day", "action": "pay", "measure": "count", "limit": 1_000,
            "window": {"type": "calendar", "period": "day", "timezone_attribute": "tz"}}),
        json!({"id": "rolling", "action": "pay", "measure": "amount", "limit": 1_000_000,
            "window": {"type": "rolling", "seconds": 3600, "bucket_seconds": 60}}),
        json!({"id": "bucket", "action": "pay", "measure": "count", "limit": 500,
            "window": {"type": "token_bucket", "seconds": 60}}),
        json!({"id": "country", "action": "pay", "measure": "amount", "limit": 1_000_000,
            "scope": ["country"], "window": {"type": "calendar", "period": "month"}}),
    ]
}

fn pay(subject: &str, amount: u64) -> Value {
    json!({"action": "pay", "subject": subject, "amount": amount,
        "attributes": {"country": "NG", "tz": "Asia/Tokyo"}})
}

/// Consumes, refunds, holds and their settlement over a few minutes of the fake clock.
async fn traffic(app: &TestApp) {
    for i in 0..6u64 {
        let subject = format!("u{}", i % 3);
        let charged = app.quota("/quota/consume", pay(&subject, 100 + i)).await;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
        if i % 2 == 0 {
            let id = charged.body["consumption_id"].clone();
            let refund = app
                .quota("/quota/refund", json!({"consumption_id": id, "amount": 50}))
                .await;
            assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
        }
        let mut held = pay(&subject, 30);
        held["ttl_seconds"] = json!(90);
        let hold = app.quota("/quota/holds", held).await;
        assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
        let hold_id = hold.body["hold_id"].as_str().unwrap().to_owned();
        match i % 3 {
            0 => {
                let path = format!("/quota/holds/{hold_id}/commit");
                let body = json!({"amount": 10});
                assert_eq!(app.quota(&path, body).await.status, StatusCode::OK);
            }
            1 => {
                let path = format!("/quota/holds/{hold_id}/release");
                assert_eq!(app.quota(&path, json!({})).await.status, StatusCode::OK);
            }
            _ => {}
        }
        app.advance(40);
        app.engine.expire_due_holds().await;
    }
}

async fn after_any_traffic_every_budget_agrees_with_the_ledger_until_a_row_is_deleted(
    policy: PolicyBackend,
) {
    after_traffic_and_a_deleted_row(policy, CounterBackend::Memory).await;
}

async fn after_traffic_and_a_deleted_row(policy: PolicyBackend, counters: CounterBackend) {
    let app = spawn_app(policy, counters).await;
    for policy in policies() {
        app.must_create_policy(policy).await;
    }
    traffic(&app).await;
    assert_no_drift(&app).await;
    let (status, printed) = cli_verify(&app).await;
    assert_eq!(status, 0, "{printed}");
    assert!(printed.contains("no drift"), "{printed}");

    // A restart rebuilds the same counters (kill -9: from the ledger alone).
    let app = app.crash_restart().await;
    assert_no_drift(&app).await;

    // Someone deletes a charge from the book of record by hand (once it is there).
    if counters != CounterBackend::Memory {
        app.engine.drain_ledger_now().await;
    }
    let url = app.settings.database_url.clone();
    delete_last_charge(&url).await;
    let verified = verify(&app).await;
    let drift = verified["drift"].as_array().unwrap();
    assert!(!drift.is_empty(), "{verified}");
    for item in drift {
        assert!(item["live"].as_u64() > item["ledger"].as_u64(), "{item}");
        assert!(item["policy_id"].is_string(), "{item}");
    }
    // The shared budget too (on a cluster: nothing is in flight across slots).
    assert!(
        drift
            .iter()
            .any(|d| d["policy_id"] == "country" && d["budget"] == json!({"country": "NG"})),
        "{verified}"
    );
    let (status, printed) = cli_verify(&app).await;
    assert_eq!(status, 1, "{printed}");
    assert!(printed.contains("drift: policy"), "{printed}");
    let metrics = app.metrics_text().await;
    let expected = format!("quota_counter_drift_budgets {}", drift.len());
    assert!(metrics.contains(&expected), "{expected} in\n{metrics}");
}

/// Deletes the newest `charge` row of the ledger at `url`.
async fn delete_last_charge(url: &str) {
    let sql = "DELETE FROM ledger_entries WHERE seq = \
               (SELECT MAX(seq) FROM ledger_entries WHERE kind = 'charge')";
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
}

async fn a_verify_while_traffic_flows_reports_no_drift(policy: PolicyBackend) {
    verify_while_traffic_flows(policy, CounterBackend::Memory, policies()).await;
}

async fn verify_while_traffic_flows(
    policy: PolicyBackend,
    counters: CounterBackend,
    policies: Vec<Value>,
) {
    let app = std::sync::Arc::new(spawn_app(policy, counters).await);
    for policy in policies {
        app.must_create_policy(policy).await;
    }
    let load = {
        let app = app.clone();
        tokio::spawn(async move {
            for round in 0..40u64 {
                let requests = (0..8u64).map(|i| {
                    let app = app.clone();
                    async move {
                        app.quota("/quota/consume", pay(&format!("s{i}"), round + 1))
                            .await
                    }
                });
                for answer in futures_join(requests).await {
                    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
                }
            }
        })
    };
    for _ in 0..5 {
        assert_eq!(verify(&app).await["drift"], json!([]));
    }
    load.await.unwrap();
    assert_no_drift(&app).await;
}

/// Runs `futures` concurrently and collects their outputs.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

async fn a_verify_that_cannot_read_the_ledger_cannot_tell(policy: PolicyBackend) {
    let app = spawn_app(policy, CounterBackend::Memory).await;
    app.must_create_policy(policies().remove(0)).await;
    assert_eq!(
        app.quota("/quota/consume", pay("u", 1)).await.status,
        StatusCode::OK
    );
    // A refusal of writes leaves reads working: the verify still tells.
    let refusal = Refusal::install(&app.settings.database_url).await;
    assert_no_drift(&app).await;
    refusal.lift().await;
    // A service that is not there: exit 2.
    let gone = format!("http://127.0.0.1:{}", crate::helpers::free_port());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"))
        .args(["counters", "verify", "--url", &gone])
        .env("QUOTA_ADMIN_TOKEN", crate::helpers::ADMIN_TOKEN)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

on_policy_stores!(
    after_any_traffic_every_budget_agrees_with_the_ledger_until_a_row_is_deleted,
    a_verify_while_traffic_flows_reports_no_drift,
    a_verify_that_cannot_read_the_ledger_cannot_tell,
);

/// Redis keeps the ledger partly in its streams: the same promises, on standalone Redis and
/// on a cluster, with the streams drained and not.
mod on_redis_counters {
    use super::*;

    #[tokio::test]
    async fn after_any_traffic_every_budget_agrees_until_a_row_is_deleted_on_redis() {
        after_traffic_and_a_deleted_row(PolicyBackend::Postgres, CounterBackend::Redis).await;
    }

    #[tokio::test]
    async fn after_any_traffic_every_budget_agrees_until_a_row_is_deleted_on_a_cluster() {
        after_traffic_and_a_deleted_row(PolicyBackend::Postgres, CounterBackend::Cluster).await;
    }

    /// Without a budget shared by subjects, each shard is read at its own instant.
    #[tokio::test]
    async fn a_verify_while_traffic_flows_reports_no_drift_on_redis_shard_by_shard() {
        let mut policies = policies();
        policies.retain(|p| p["id"] != "country");
        verify_while_traffic_flows(PolicyBackend::Postgres, CounterBackend::Redis, policies).await;
    }

    /// With one, every shard at one instant.
    #[tokio::test]
    async fn a_verify_while_traffic_flows_reports_no_drift_on_redis_with_a_shared_budget() {
        verify_while_traffic_flows(PolicyBackend::Postgres, CounterBackend::Redis, policies())
            .await;
    }

    #[tokio::test]
    async fn a_verify_while_traffic_flows_reports_no_drift_on_a_cluster() {
        verify_while_traffic_flows(PolicyBackend::Postgres, CounterBackend::Cluster, policies())
            .await;
    }

    /// A consume across slots stopped between its reservations and its finalize has
    /// charged the country's budget with no entry yet: that budget is not compared (the
    /// verify cannot tell) rather than shown as drift; once the sweeper abandons it, it is.
    #[tokio::test]
    async fn a_consume_across_slots_in_flight_is_never_drift_on_a_cluster() {
        use quota_ledger::engine::faults::Fault;
        let app =
            std::sync::Arc::new(spawn_app(PolicyBackend::Postgres, CounterBackend::Cluster).await);
        for policy in policies() {
            app.must_create_policy(policy).await;
        }
        let charged = app.quota("/quota/consume", pay("u0", 100)).await;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
        app.engine
            .faults()
            .arm_with("crossslot.finalize", Fault::Pause);
        let stuck = {
            let app = app.clone();
            tokio::spawn(async move { app.quota("/quota/consume", pay("u1", 500)).await })
        };
        crate::helpers::eventually(
            std::time::Duration::from_secs(5),
            "the consume waits before its finalize",
            || async { (app.engine.faults().paused() > 0).then_some(()) },
        )
        .await;
        let verified = verify(&app).await;
        assert_eq!(verified["drift"], json!([]), "{verified}");
        assert_eq!(verified["not_compared"], 1, "{verified}");
        let (status, printed) = cli_verify(&app).await;
        assert_eq!(status, 2, "{printed}");
        assert!(printed.contains("could not be compared"), "{printed}");

        // The sweeper abandons it past its deadline (5 s, and 5 s of skew on the test's
        // clock): the budgets settle, and agree.
        app.advance(11);
        crate::helpers::eventually(
            std::time::Duration::from_secs(30),
            "the sweeper abandons the attempt",
            || async {
                let verified = verify(&app).await;
                (verified["not_compared"] == 0).then_some(())
            },
        )
        .await;
        assert_no_drift(&app).await;
        stuck.abort();
    }
}
