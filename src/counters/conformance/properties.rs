//! Random decisions. Rolling windows are checked against a naive model (and so never hold
//! more than the limit in any trailing window); then memory and Redis, and memory and Redis
//! Cluster, must give identical evaluations, and matching TTLs, for the same random sequences
//! of all three algorithms.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::{
    clean_up_tag, redis_store, unique_tag, Harness, MemoryCounterStore, RedisProbe, MAX, T0,
};
use crate::engine::store::{Algorithm, Charge, CounterStore, Evaluation};

/// A current-thread runtime for driving the async stores from proptest's sync closures.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Proptest settings; failures are persisted next to this file like `proptest!` does.
fn config(cases: u32) -> Config {
    Config {
        cases,
        source_file: Some(file!()),
        ..Config::default()
    }
}

/// One rolling window and a sequence of (clock step, cost) charges on it.
#[derive(Debug, Clone)]
struct RollingCase {
    bucket_ms: i64,
    buckets: i64,
    limit: u64,
    steps: Vec<(i64, u64)>,
}

fn rolling_case() -> impl Strategy<Value = RollingCase> {
    let steps = prop::collection::vec((0i64..=120, 0u64..=8), 1..100);
    (1i64..=50, 1i64..=8, 0u64..=20, steps).prop_map(|(bucket_ms, buckets, limit, steps)| {
        RollingCase {
            bucket_ms,
            buckets,
            limit,
            steps,
        }
    })
}

/// Charges `case` on `store` and compares every answer with the rolling-window definition:
/// used = units charged in buckets `>= current - buckets`; never more than the limit in any
/// trailing window of `W` ms ending at a charge.
async fn check_rolling(
    store: &dyn CounterStore,
    key: &str,
    case: &RollingCase,
) -> Result<(), TestCaseError> {
    let (b, n, limit) = (case.bucket_ms, case.buckets, case.limit);
    let mut now = T0;
    let mut allowed: Vec<(i64, u64)> = Vec::new();
    for &(step, cost) in &case.steps {
        now += step;
        let charge = Charge {
            key: crate::keys::CounterKey::read(key),
            algorithm: Algorithm::Rolling {
                bucket_ms: b,
                buckets: n,
            },
            limit,
            cost,
            enforce: true,
        };
        let evaluation = store
            .evaluate(now, &[charge], true)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let oldest_live = now.div_euclid(b) - n;
        let used: u64 = allowed
            .iter()
            .filter(|(t, _)| t.div_euclid(b) >= oldest_live)
            .map(|(_, c)| c)
            .sum();
        let fits = used + cost <= limit;
        prop_assert_eq!(evaluation.allowed, fits, "at {}: {:?}", now, evaluation);
        prop_assert_eq!(
            evaluation.outcomes[0].used,
            if fits { used + cost } else { used }
        );
        if fits && cost > 0 {
            allowed.push((now, cost));
            let in_window: u64 = allowed
                .iter()
                .filter(|(t, _)| *t >= now - b * n)
                .map(|(_, c)| c)
                .sum();
            prop_assert!(
                in_window <= limit,
                "{} units in the window ending at {}",
                in_window,
                now
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn rolling_windows_never_hold_more_than_the_limit_on_memory(case in rolling_case()) {
        let store = MemoryCounterStore::new();
        runtime().block_on(check_rolling(&store, "ql-test:{p}:roll", &case))?;
    }
}

#[test]
fn rolling_windows_never_hold_more_than_the_limit_on_redis() {
    let rt = runtime();
    let (store, probe) =
        rt.block_on(async { (redis_store().await, RedisProbe::standalone().await) });
    let mut runner = TestRunner::new(config(32));
    let result = runner.run(&rolling_case(), |case| {
        rt.block_on(async {
            let tag = unique_tag("rolling-property");
            let verdict = check_rolling(&store, &format!("ql-test:{{{tag}}}:roll"), &case).await;
            clean_up_tag(&probe, &tag).await;
            verdict
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// One policy of a random case: its window, base limit and mode.
#[derive(Debug, Clone)]
struct Policy {
    /// Calendar: period length (periods are `[k × p, (k + 1) × p)`); rolling: (B, W/B);
    /// token bucket: period.
    algorithm: Algorithm,
    limit: u64,
    enforce: bool,
}

/// One decision of a random case.
#[derive(Debug, Clone)]
struct Step {
    /// Clock step; negative steps model another instance whose clock runs behind.
    advance: i64,
    /// Which of the three policies take part (bit i for policy i, never 0).
    mask: u8,
    costs: [u64; 3],
    /// Halve every limit for this decision (an override lowering it).
    lowered: bool,
    commit: bool,
}

#[derive(Debug, Clone)]
struct Case {
    start: i64,
    policies: [Policy; 3],
    steps: Vec<Step>,
}

fn limit() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..=12, 1 => (MAX - 20)..=MAX, 1 => 0u64..=MAX]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 0u64..=6, 1 => 0u64..=MAX, 1 => (MAX / 4)..=(MAX / 2), 1 => (MAX - 10)..=MAX]
}

fn policies() -> impl Strategy<Value = [Policy; 3]> {
    // The period length, see `charges`; half of the cases count zoned periods instead.
    let calendar = (1i64..=5_000, limit(), any::<bool>(), any::<bool>()).prop_map(
        |(p, limit, enforce, zoned)| Policy {
            algorithm: match zoned {
                false => Algorithm::Calendar { period_end_ms: p },
                true => Algorithm::ZonedCalendar { period_end_ms: p },
            },
            limit,
            enforce,
        },
    );
    let rolling =
        (1i64..=300, 1i64..=12, limit(), any::<bool>()).prop_map(|(b, n, limit, enforce)| Policy {
            algorithm: Algorithm::Rolling {
                bucket_ms: b,
                buckets: n,
            },
            limit,
            enforce,
        });
    // limit × period_ms must stay below 2^53: small limits, or the largest ones that fit.
    let token = (1i64..=5_000).prop_flat_map(|p| {
        let top = MAX / p as u64;
        let limit = prop_oneof![3 => 0u64..=12, 1 => top.saturating_sub(5)..=top];
        (Just(p), limit, any::<bool>()).prop_map(|(p, limit, enforce)| Policy {
            algorithm: Algorithm::TokenBucket { period_ms: p },
            limit,
            enforce,
        })
    });
    // A per-request maximum in the third place now and then: stateless, it must still decide
    // alike beside the others, and never deny them when it passes.
    let request = (limit(), any::<bool>()).prop_map(|(limit, enforce)| Policy {
        algorithm: Algorithm::Request,
        limit,
        enforce,
    });
    // A lifetime counter too: it never expires (no TTL on Redis, as in memory).
    let lifetime = (limit(), any::<bool>()).prop_map(|(limit, enforce)| Policy {
        algorithm: Algorithm::Lifetime,
        limit,
        enforce,
    });
    let third = prop_oneof![4 => token, 1 => request, 1 => lifetime];
    (calendar, rolling, third).prop_map(|(c, r, t)| [c, r, t])
}

fn case() -> impl Strategy<Value = Case> {
    let advance =
        prop_oneof![3 => 0i64..=50, 3 => 0i64..=2_000, 1 => -500i64..=0, 1 => 0i64..=100_000];
    let step = (
        advance,
        1u8..=7,
        [cost(), cost(), cost()],
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(advance, mask, costs, lowered, commit)| Step {
            advance,
            mask,
            costs,
            lowered,
            commit,
        });
    (0i64..1_000_000, policies(), prop::collection::vec(step, 50)).prop_map(
        |(offset, policies, steps)| Case {
            start: T0 + offset,
            policies,
            steps,
        },
    )
}

/// The charges of `step` at `now`; calendar keys name their period like `crate::keys` does.
fn charges(h: &Harness, case: &Case, step: &Step, now: i64) -> Vec<Charge> {
    let mut charges = Vec::with_capacity(3);
    for (i, policy) in case.policies.iter().enumerate() {
        if step.mask & (1 << i) == 0 {
            continue;
        }
        let (key, algorithm) = match policy.algorithm {
            Algorithm::Calendar { period_end_ms: p } => {
                let period = now.div_euclid(p);
                (
                    h.key(&format!("cal:{period}")),
                    Algorithm::Calendar {
                        period_end_ms: (period + 1) * p,
                    },
                )
            }
            // A zoned period's candidate end moves with `now` (as another zone's would): the
            // running period must win on both stores alike.
            Algorithm::ZonedCalendar { period_end_ms: p } => (
                h.key("zoned"),
                Algorithm::ZonedCalendar {
                    period_end_ms: (now.div_euclid(p) + 1) * p,
                },
            ),
            Algorithm::Rolling { .. } => (h.key("roll"), policy.algorithm),
            Algorithm::TokenBucket { .. } => (h.key("tok"), policy.algorithm),
            Algorithm::Request => (h.key("req"), policy.algorithm),
            Algorithm::Lifetime => (h.key("life"), policy.algorithm),
        };
        let limit = if step.lowered {
            policy.limit / 2
        } else {
            policy.limit
        };
        charges.push(Charge {
            key: crate::keys::CounterKey::read(key),
            algorithm,
            limit,
            cost: step.costs[i],
            enforce: policy.enforce,
        });
    }
    charges
}

/// Runs `case` on a fresh memory store and on Redis; every evaluation must be identical, and
/// every key a decision wrote must carry the same TTL on both (Redis's is a little lower: real
/// time passes).
async fn check_agreement(
    memory: &Harness,
    redis: &Harness,
    case: &Case,
) -> Result<(), TestCaseError> {
    // A calendar key's later charges in its period keep the TTL its first one set (INCRBY):
    // the same deadline, the period's end plus the grace, in real time. But this clock jumps
    // back and forth within the period while Redis's TTL runs in real time, so the two may
    // differ by up to a period here.
    let calendar_slack = case
        .policies
        .iter()
        .filter_map(|p| match p.algorithm {
            Algorithm::Calendar { period_end_ms } => Some(period_end_ms),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut now = case.start;
    for (i, step) in case.steps.iter().enumerate() {
        now += step.advance;
        let on_memory = memory
            .eval(now, &charges(memory, case, step, now), step.commit)
            .await;
        let on_redis: Evaluation = redis
            .eval(now, &charges(redis, case, step, now), step.commit)
            .await;
        prop_assert_eq!(&on_memory, &on_redis, "step {} at {}", i, now);
        if !(step.commit && on_memory.allowed) {
            continue;
        }
        let written = charges(memory, case, step, now)
            .into_iter()
            .zip(charges(redis, case, step, now));
        for ((m, r), o) in written.zip(&on_memory.outcomes) {
            let saturated = match m.algorithm {
                Algorithm::TokenBucket { period_ms } => MAX.div_ceil(period_ms as u64),
                _ => MAX,
            };
            if m.cost == 0 || o.used >= saturated {
                continue; // nothing written, or maybe not: usage was already saturated
            }
            let expected = memory.ttl_ms(m.key.as_str(), now).await.unwrap_or(-2);
            let actual = redis.ttl_ms(r.key.as_str(), now).await.unwrap_or(-2);
            let slack = match m.algorithm {
                Algorithm::Calendar { .. } => calendar_slack,
                _ => 0,
            };
            prop_assert!(
                actual <= expected + slack && actual > expected - 3_000 - slack,
                "step {}: TTL of {} is {} on Redis, {} in memory",
                i,
                m.key,
                actual,
                expected
            );
        }
    }
    Ok(())
}

/// The Redis deployment a random case runs on, besides memory.
#[derive(Debug, Clone, Copy)]
enum Deployment {
    /// The standalone server.
    Standalone,
    /// The 3-master cluster.
    Cluster,
}

/// Runs `cases` random cases on memory and on `deployment`: both must answer identically.
fn agreement(deployment: Deployment, cases: u32) {
    let rt = runtime();
    let mut runner = TestRunner::new(config(cases));
    let result = runner.run(&case(), |case| {
        rt.block_on(async {
            let memory = Harness::memory();
            let redis = match deployment {
                Deployment::Standalone => Harness::redis("agreement").await,
                Deployment::Cluster => Harness::cluster("agreement").await,
            };
            let verdict = check_agreement(&memory, &redis, &case).await;
            redis.clean_up().await;
            verdict
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

#[test]
fn memory_and_redis_answer_every_random_decision_identically() {
    agreement(Deployment::Standalone, 64);
}

/// Fewer cases than on Redis (the script is the same): each case has its own hash tag, so
/// the cases spread over the nodes and show that routing and replies survive the cluster.
#[test]
fn memory_and_the_cluster_answer_every_random_decision_identically() {
    agreement(Deployment::Cluster, 16);
}
