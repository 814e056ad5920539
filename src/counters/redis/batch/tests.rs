//! Batched decisions on a real Redis: exact under a burst, each decided on its own.

use super::{batch_command, keys_and_args, split, MAX_BATCH};
use crate::counters::conformance::{charge, redis_store, unique_tag};
use crate::engine::store::{Algorithm, CounterStore, StoreError};
use redis::{Cmd, Script};
use std::sync::Arc;

const T0: i64 = 1_900_000_000_000;
const DAY: i64 = 86_400_000;

fn evalsha(keys: &[&str], args: &[&str]) -> Cmd {
    let mut cmd = Cmd::new();
    cmd.arg("EVALSHA").arg("sha").arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

#[test]
fn a_batch_call_carries_each_decisions_keys_and_arguments_in_order() {
    let (one, two) = (
        evalsha(&["k1", "k2"], &["a", "b", "c"]),
        evalsha(&["k3"], &["d"]),
    );
    assert_eq!(keys_and_args(&one).0, [b"k1".as_slice(), b"k2"]);
    let script = Script::new("return 1");
    let batch = batch_command(&script, &[&one, &two]);
    let args: Vec<String> = batch
        .args_iter()
        .filter_map(|arg| match arg {
            redis::Arg::Simple(v) => Some(String::from_utf8_lossy(v).into_owned()),
            _ => None,
        })
        .collect();
    let hash = script.get_hash().to_owned();
    let expected = [
        "EVALSHA", &hash, "3", "k1", "k2", "k3", "2", "2", "3", "1", "1", "a", "b", "c", "d",
    ];
    assert_eq!(args, expected);
}

#[test]
fn each_decision_gets_its_own_reply_or_the_calls_failure() {
    let replies = split(Err(StoreError::Timeout("late".into())), 3);
    assert_eq!(replies.len(), 3);
    assert!(replies
        .iter()
        .all(|r| matches!(r, Err(StoreError::Timeout(_)))));
}

/// 200 decisions at once on one thread's connection, for one counter with a limit of 5:
/// they go in batches, and exactly 5 are allowed, each seeing the usage of those before it.
#[tokio::test]
async fn a_burst_goes_in_batches_and_admits_exactly_the_limit() {
    let store = Arc::new(redis_store().await);
    let key = format!("ql-test:{{{}}}:burst", unique_tag("batch"));
    let burst = charge(
        &key,
        Algorithm::Calendar {
            period_end_ms: T0 + DAY,
        },
        5,
        1,
    );
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (store, burst) = (store.clone(), burst.clone());
        tasks.spawn(async move { store.evaluate(T0, &[burst], true).await });
    }
    let mut used = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let evaluation = done.expect("the task ran").expect("Redis answered");
        if evaluation.allowed {
            used.push(evaluation.outcomes[0].used);
        }
    }
    used.sort_unstable();
    assert_eq!(
        used,
        [1, 2, 3, 4, 5],
        "each allowed one saw those before it"
    );
    let sent = store.decision_calls().expect("Redis counts its calls");
    assert_eq!(sent.decisions, 200);
    assert!(sent.calls <= 20, "200 decisions in {} calls", sent.calls);
    assert!(
        store.batched_decisions() >= 100,
        "most went in batches: {}",
        store.batched_decisions()
    );
    let after = store.evaluate(T0, &[burst], false).await.expect("a peek");
    assert_eq!(after.outcomes[0].used, 5);
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(
            &mut redis::Client::open(crate::counters::conformance::redis_url())
                .expect("a URL")
                .get_multiplexed_async_connection()
                .await
                .expect("a connection"),
        )
        .await
        .expect("clean-up");
}

/// A decision that fails in a batch (its counter holds a value of another kind) fails
/// alone: the decisions around it are decided.
#[tokio::test]
async fn a_decision_that_fails_in_a_batch_fails_alone() {
    let store = Arc::new(redis_store().await);
    let tag = unique_tag("batch-error");
    let (good, bad) = (
        format!("ql-test:{{{tag}}}:good"),
        format!("ql-test:{{{tag}}}:bad"),
    );
    let mut probe = redis::Client::open(crate::counters::conformance::redis_url())
        .expect("a URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let _: () = redis::cmd("SET")
        .arg(&bad)
        .arg("not a zoned calendar")
        .query_async(&mut probe)
        .await
        .expect("set");
    let zoned = Algorithm::ZonedCalendar {
        period_end_ms: T0 + DAY,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..MAX_BATCH {
        let store = store.clone();
        let one = match i {
            7 => charge(&bad, zoned, 100, 1),
            _ => charge(
                &good,
                Algorithm::Calendar {
                    period_end_ms: T0 + DAY,
                },
                1_000,
                1,
            ),
        };
        tasks.spawn(async move { (i, store.evaluate(T0, &[one], true).await) });
    }
    let mut allowed = 0;
    while let Some(done) = tasks.join_next().await {
        match done.expect("the task ran") {
            (7, answer) => assert!(
                matches!(answer, Err(StoreError::Protocol(ref why)) if why.contains("zoned")),
                "{answer:?}"
            ),
            (_, answer) => allowed += u32::from(answer.expect("decided").allowed),
        }
    }
    assert_eq!(allowed, 63);
    assert!(store.batched_decisions() > 0);
    let _: () = redis::cmd("DEL")
        .arg(&good)
        .arg(&bad)
        .query_async(&mut probe)
        .await
        .expect("clean-up");
}
