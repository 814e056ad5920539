//! Property: after any history of consumes, refunds, holds, commits, releases, clock
//! steps and restarts, a restart of the embedded default answers every read exactly as
//! the service would have without it: usage, checks, and retries of keyed consumes. A
//! graceful restart starts from the snapshot it took; a crash restart (no snapshot) from
//! the last graceful one's snapshot and the ledger after it, or from the whole ledger.

use crate::helpers::{calendar_policy, spawn_app, Answer, CounterBackend, PolicyBackend, TestApp};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::StatusCode;
use serde_json::{json, Value};

const SUBJECTS: u8 = 3;

/// One step of a history.
#[derive(Debug, Clone)]
enum Step {
    Consume {
        subject: u8,
        amount: u64,
        key: Option<u8>,
    },
    Refund {
        consume: Index,
        amount: Option<u64>,
    },
    Hold {
        subject: u8,
        amount: u64,
        ttl: u64,
    },
    Commit {
        hold: Index,
        amount: Option<u64>,
    },
    Release {
        hold: Index,
    },
    Advance {
        seconds: i64,
    },
    /// Stops the service (gracefully: it snapshots its counters; or as kill -9 does) and
    /// starts it again; every read must answer as before.
    Restart {
        graceful: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..SUBJECTS, 1u64..400, prop::option::of(0u8..3))
            .prop_map(|(subject, amount, key)| Step::Consume { subject, amount, key }),
        2 => (any::<Index>(), prop::option::of(1u64..300))
            .prop_map(|(consume, amount)| Step::Refund { consume, amount }),
        2 => (0..SUBJECTS, 1u64..400, 30u64..400)
            .prop_map(|(subject, amount, ttl)| Step::Hold { subject, amount, ttl }),
        1 => (any::<Index>(), prop::option::of(1u64..400))
            .prop_map(|(hold, amount)| Step::Commit { hold, amount }),
        1 => any::<Index>().prop_map(|hold| Step::Release { hold }),
        2 => (0i64..900).prop_map(|seconds| Step::Advance { seconds }),
        1 => any::<bool>().prop_map(|graceful| Step::Restart { graceful }),
    ]
}

/// A keyed consume that was allowed: retrying it must replay its answer.
#[derive(Debug, Clone)]
struct Keyed {
    body: Value,
}

/// What a history left behind to look at.
#[derive(Default)]
struct Seen {
    consumptions: Vec<Value>,
    holds: Vec<String>,
    keyed: Vec<Keyed>,
}

async fn app() -> TestApp {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy(
        "daily",
        "transfer",
        10,
        "day",
        "America/New_York",
    ))
    .await;
    app.must_create_policy(json!({"id": "hourly-cents", "action": "transfer",
        "measure": "amount", "limit": 1500,
        "window": {"type": "rolling", "seconds": 3600, "bucket_seconds": 60}}))
        .await;
    app.must_create_policy(
        json!({"id": "per-minute", "action": "transfer", "measure": "count",
        "limit": 6, "window": {"type": "token_bucket", "seconds": 60}}),
    )
    .await;
    app
}

fn subject(n: u8) -> String {
    format!("s-{n}")
}

/// Runs `history` on `app`; returns the app (another instance after a restart) and what
/// the history left to look at, or the first read a restart changed.
async fn run(mut app: TestApp, history: &[Step]) -> Result<(TestApp, Seen), TestCaseError> {
    let mut seen = Seen::default();
    for step in history {
        match step {
            Step::Restart { graceful } => app = restart(app, *graceful, &seen).await?,
            step => act(&app, step, &mut seen).await,
        }
    }
    Ok((app, seen))
}

/// Takes one step other than a restart.
async fn act(app: &TestApp, step: &Step, seen: &mut Seen) {
    match step {
        Step::Consume {
            subject: n,
            amount,
            key,
        } => {
            let mut body = json!({"action": "transfer", "subject": subject(*n), "amount": amount});
            if let Some(key) = key {
                body["idempotency_key"] = json!(format!("k-{n}-{key}"));
            }
            let answer = app.quota("/quota/consume", body.clone()).await;
            if answer.status == StatusCode::OK && answer.body["replayed"] == false {
                seen.consumptions
                    .push(answer.body["consumption_id"].clone());
                if key.is_some() {
                    seen.keyed.push(Keyed { body });
                }
            }
        }
        Step::Refund { consume, amount } => {
            if seen.consumptions.is_empty() {
                return;
            }
            let id = consume.get(&seen.consumptions).clone();
            let mut body = json!({"consumption_id": id});
            if let Some(amount) = amount {
                body["amount"] = json!(amount);
            }
            app.quota("/quota/refund", body).await;
        }
        Step::Hold {
            subject: n,
            amount,
            ttl,
        } => {
            let body = json!({"action": "transfer", "subject": subject(*n),
                "amount": amount, "ttl_seconds": ttl});
            let answer = app.quota("/quota/holds", body).await;
            if let Some(id) = answer.body["hold_id"].as_str() {
                seen.holds.push(id.to_owned());
            }
        }
        Step::Commit { hold, amount } => {
            if seen.holds.is_empty() {
                return;
            }
            let id = hold.get(&seen.holds);
            let body = amount.map_or(json!({}), |amount| json!({"amount": amount}));
            app.quota(&format!("/quota/holds/{id}/commit"), body).await;
        }
        Step::Release { hold } => {
            if seen.holds.is_empty() {
                return;
            }
            let id = hold.get(&seen.holds);
            app.quota(&format!("/quota/holds/{id}/release"), json!({}))
                .await;
        }
        Step::Advance { seconds } => app.advance(*seconds),
        Step::Restart { .. } => {}
    }
}

/// Restarts `app` gracefully or as kill -9 would; fails if any read changed.
async fn restart(app: TestApp, graceful: bool, seen: &Seen) -> Result<TestApp, TestCaseError> {
    // What the background sweeper would do by now, so both sides see it done.
    app.engine.expire_due_holds().await;
    let before = observe(&app, seen).await;
    let app = match graceful {
        true => app.restart().await,
        false => app.crash_restart().await,
    };
    let after = observe(&app, seen).await;
    prop_assert_eq!(before, after, "graceful: {}", graceful);
    Ok(app)
}

/// Every read the history can be judged by; none of them changes anything.
async fn observe(app: &TestApp, seen: &Seen) -> Vec<(String, StatusCode, Value)> {
    let mut reads = Vec::new();
    let mut record = |what: String, answer: Answer| reads.push((what, answer.status, answer.body));
    for n in 0..SUBJECTS {
        record(
            format!("usage of {}", subject(n)),
            app.usage("transfer", &subject(n)).await,
        );
        let check = json!({"action": "transfer", "subject": subject(n), "amount": 100});
        record(
            format!("check of {}", subject(n)),
            app.quota("/quota/check", check).await,
        );
    }
    for keyed in &seen.keyed {
        record(
            format!("retry of {}", keyed.body),
            app.quota("/quota/consume", keyed.body.clone()).await,
        );
    }
    reads
}

#[test]
fn a_restart_changes_no_answer_after_any_history() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let config = Config {
        cases: 16,
        source_file: Some(file!()),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(step(), 5..45), |history| {
        runtime.block_on(async {
            let (app, seen) = run(app().await, &history).await?;
            let app = restart(app, true, &seen).await?;
            restart(app, false, &seen).await?;
            Ok::<(), TestCaseError>(())
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
