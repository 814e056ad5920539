//! One scenario suite for every [`CounterStore`]: each scenario is written once, against the
//! trait, and [`scenarios!`] runs it on the in-process store, on Redis and on Redis Cluster.
//!
//! Redis is the server at `QUOTA_TEST_REDIS_URL`, the cluster the nodes listed in
//! `QUOTA_TEST_REDIS_CLUSTER_URLS` (the test command always sets both; without them the Redis
//! and cluster variants fail rather than skip, so a green run means every backend ran).
//! Each test uses its own hash tag (test name, process, time and a counter), so tests run in
//! parallel on one server, their keys land in different cluster slots and so on different
//! nodes, and each deletes its keys at the end. Time is a fake clock around [`T0`], far from
//! real time: the stores must only ever use the `now_ms` they are given (Redis TTLs are
//! relative for that reason).
//!
//! - `calendar`, `rolling`, `token_bucket`: each algorithm with concrete numbers.
//! - `decisions`: all-or-nothing, shadow charges, peeks, zero costs, lowered limits, TTLs,
//!   argument checks.
//! - `properties`: random decisions; no trailing window ever holds more than the limit, and
//!   memory, Redis and the cluster give identical answers for identical random sequences.
//! - `cluster`: where keys live in a cluster, and following MOVED / ASK while a slot moves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::memory::MemoryCounterStore;
use super::redis::RedisCounterStore;
use crate::engine::store::{Algorithm, Charge, CounterStore, Evaluation, Outcome, StoreError};

/// Runs each named scenario (an `async fn(&Harness)`) once per backend, as
/// `<scenario>::on_memory`, `<scenario>::on_redis` and `<scenario>::on_cluster`.
macro_rules! scenarios {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn on_memory() {
                let harness = $crate::counters::conformance::Harness::memory();
                super::$scenario(&harness).await;
            }

            #[tokio::test]
            async fn on_redis() {
                let harness =
                    $crate::counters::conformance::Harness::redis(stringify!($scenario)).await;
                super::$scenario(&harness).await;
                harness.clean_up().await;
            }

            #[tokio::test]
            async fn on_cluster() {
                let harness =
                    $crate::counters::conformance::Harness::cluster(stringify!($scenario)).await;
                super::$scenario(&harness).await;
                harness.clean_up().await;
            }
        }
    )+};
}

mod calendar;
mod cluster;
mod decisions;
mod effects;
mod giveback;
mod lifetime;
mod properties;
mod request;
mod rolling;
mod token_bucket;

/// The fake clock's origin: 2001-09-09, a whole number of seconds, days and buckets.
pub(super) const T0: i64 = 1_000_000_000_000;
/// One day in milliseconds.
pub(super) const DAY: i64 = 86_400_000;
/// The largest quantity: 2^53 - 1.
pub(super) const MAX: u64 = (1 << 53) - 1;

/// A store under test and a way to look at its keys from outside the trait.
pub(super) struct Harness {
    /// The backend, used only through the trait by the scenarios.
    pub(super) store: Arc<dyn CounterStore>,
    /// Backend-specific inspection (key TTLs, bucket counts).
    probe: Probe,
    /// This test's hash tag: unique per test and per run.
    tag: String,
}

/// Inspection of a backend's keys.
enum Probe {
    /// The in-process store, inspected directly.
    Memory(Arc<MemoryCounterStore>),
    /// A separate Redis (or cluster) connection for PTTL, HLEN and clean-up.
    Redis(RedisProbe),
}

/// A connection to the Redis or the cluster under test, besides the store's own.
#[derive(Clone)]
pub(super) enum RedisProbe {
    /// To the standalone Redis.
    Standalone(redis::aio::MultiplexedConnection),
    /// To the cluster: commands are routed by key slot, like the store's.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RedisProbe {
    /// A probe of the standalone Redis at `QUOTA_TEST_REDIS_URL`.
    pub(super) async fn standalone() -> Self {
        let connection = redis::Client::open(redis_url())
            .expect("a valid Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("a probe connection to Redis");
        Self::Standalone(connection)
    }

    /// A probe of the cluster at `QUOTA_TEST_REDIS_CLUSTER_URLS`.
    pub(super) async fn cluster() -> Self {
        let connection = redis::cluster::ClusterClient::new(cluster_urls())
            .expect("valid cluster URLs")
            .get_async_connection()
            .await
            .expect("a probe connection to the cluster");
        Self::Cluster(connection)
    }

    /// Sends `command` and expects an answer of type `T`.
    pub(super) async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        let answer = match self {
            Self::Standalone(c) => command.query_async(&mut c.clone()).await,
            Self::Cluster(c) => command.query_async(&mut c.clone()).await,
        };
        answer.unwrap_or_else(|e| panic!("probe command failed: {e}"))
    }
}

/// The Redis URL for tests; a clear failure (not a skip) when it is not set.
pub(super) fn redis_url() -> String {
    std::env::var("QUOTA_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "QUOTA_TEST_REDIS_URL is not set: the Redis conformance tests need a Redis server, \
             e.g. QUOTA_TEST_REDIS_URL=redis://127.0.0.1:6379/"
        )
    })
}

/// The cluster's node URLs for tests; a clear failure (not a skip) when they are not set.
pub(super) fn cluster_urls() -> Vec<String> {
    let urls: Vec<String> = std::env::var("QUOTA_TEST_REDIS_CLUSTER_URLS")
        .unwrap_or_else(|_| {
            panic!(
                "QUOTA_TEST_REDIS_CLUSTER_URLS is not set: the cluster conformance tests need a \
                 Redis Cluster, e.g. QUOTA_TEST_REDIS_CLUSTER_URLS=redis://127.0.0.1:7000/,\
                 redis://127.0.0.1:7001/ (scripts/with-stores.sh starts one)"
            )
        })
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        !urls.is_empty(),
        "QUOTA_TEST_REDIS_CLUSTER_URLS lists no node"
    );
    urls
}

/// A tag no other test or run uses: test name, process id and a process-wide counter.
pub(super) fn unique_tag(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{name}|{}|{nanos}|{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Connects the Redis store under test.
pub(super) async fn redis_store() -> RedisCounterStore {
    RedisCounterStore::connect(&[redis_url()], false, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis at QUOTA_TEST_REDIS_URL: {e}"))
        .without_epochs()
}

/// Connects a Redis Cluster store under test.
pub(super) async fn cluster_store() -> RedisCounterStore {
    RedisCounterStore::connect(&cluster_urls(), true, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach the cluster at QUOTA_TEST_REDIS_CLUSTER_URLS: {e}")
        })
        .without_epochs()
}

impl Harness {
    /// A fresh in-process store.
    pub(super) fn memory() -> Self {
        let store = Arc::new(MemoryCounterStore::new());
        Self {
            store: store.clone(),
            probe: Probe::Memory(store),
            tag: unique_tag("memory"),
        }
    }

    /// The Redis store at `QUOTA_TEST_REDIS_URL`, with a tag unique to this test and run.
    pub(super) async fn redis(test: &str) -> Self {
        Self {
            store: Arc::new(redis_store().await),
            probe: Probe::Redis(RedisProbe::standalone().await),
            tag: unique_tag(test),
        }
    }

    /// A store on the cluster at `QUOTA_TEST_REDIS_CLUSTER_URLS`, with a tag unique to this
    /// test and run (so different tests' keys hash to different slots, on different nodes).
    pub(super) async fn cluster(test: &str) -> Self {
        Self {
            store: Arc::new(cluster_store().await),
            probe: Probe::Redis(RedisProbe::cluster().await),
            tag: unique_tag(test),
        }
    }

    /// The full key for `name`, under this test's hash tag.
    pub(super) fn key(&self, name: &str) -> String {
        format!("ql-test:{{{}}}:{name}", self.tag)
    }

    /// A key of this test under another hash tag (another shard, another cluster slot).
    pub(super) fn other_tag_key(&self, name: &str) -> String {
        format!("ql-test:{{{}-2}}:{name}", self.tag)
    }

    /// Evaluates and expects an answer.
    pub(super) async fn eval(&self, now_ms: i64, charges: &[Charge], commit: bool) -> Evaluation {
        self.store
            .evaluate(now_ms, charges, commit)
            .await
            .unwrap_or_else(|e| panic!("evaluate at {now_ms} failed: {e}"))
    }

    /// Evaluates and expects an error.
    pub(super) async fn eval_err(&self, now_ms: i64, charges: &[Charge]) -> StoreError {
        match self.store.evaluate(now_ms, charges, true).await {
            Ok(evaluation) => panic!("expected an error, got {evaluation:?}"),
            Err(error) => error,
        }
    }

    /// Commits one charge and returns its outcome.
    pub(super) async fn one(&self, now_ms: i64, charge: &Charge) -> Outcome {
        let evaluation = self.eval(now_ms, std::slice::from_ref(charge), true).await;
        assert_eq!(
            evaluation.allowed,
            evaluation.outcomes[0].allowed || !charge.enforce
        );
        evaluation.outcomes[0]
    }

    /// Peeks at one charge and returns its outcome.
    pub(super) async fn peek(&self, now_ms: i64, charge: &Charge) -> Outcome {
        self.eval(now_ms, std::slice::from_ref(charge), false)
            .await
            .outcomes[0]
    }

    /// Milliseconds until `key` expires (`None` if absent, `Some(-1)` if it never expires).
    pub(super) async fn ttl_ms(&self, key: &str, now_ms: i64) -> Option<i64> {
        match &self.probe {
            Probe::Memory(store) => store.ttl_ms(key, now_ms),
            Probe::Redis(probe) => {
                let ttl: i64 = probe.query(redis::cmd("PTTL").arg(key)).await;
                (ttl != -2).then_some(ttl)
            }
        }
    }

    /// Whether `key` exists at `now_ms`.
    pub(super) async fn exists(&self, key: &str, now_ms: i64) -> bool {
        self.ttl_ms(key, now_ms).await.is_some()
    }

    /// Number of buckets stored in the rolling counter `key`.
    pub(super) async fn bucket_count(&self, key: &str) -> usize {
        match &self.probe {
            Probe::Memory(store) => store.bucket_count(key),
            Probe::Redis(probe) => probe.query(redis::cmd("HLEN").arg(key)).await,
        }
    }

    /// Deletes this test's keys from Redis (their TTLs are in fake-clock time, which can be
    /// days of real time).
    pub(super) async fn clean_up(&self) {
        if let Probe::Redis(probe) = &self.probe {
            clean_up_tag(probe, &self.tag).await;
        }
    }
}

/// Deletes every key under hash tag `tag` (on a cluster, KEYS asks every primary).
pub(super) async fn clean_up_tag(probe: &RedisProbe, tag: &str) {
    let pattern = format!(
        "ql-test:{{{}}}:*",
        tag.replace(['*', '?', '[', ']', '\\'], "?")
    );
    let keys: Vec<String> = probe.query(redis::cmd("KEYS").arg(&pattern)).await;
    if !keys.is_empty() {
        let _: i64 = probe.query(redis::cmd("DEL").arg(&keys)).await;
    }
}

/// An enforcing charge.
pub(super) fn charge(key: &str, algorithm: Algorithm, limit: u64, cost: u64) -> Charge {
    Charge {
        key: crate::keys::CounterKey::read(key),
        algorithm,
        limit,
        cost,
        enforce: true,
    }
}

/// A shadow charge (counted and reported, never denies).
pub(super) fn shadow(key: &str, algorithm: Algorithm, limit: u64, cost: u64) -> Charge {
    Charge {
        enforce: false,
        ..charge(key, algorithm, limit, cost)
    }
}

/// A calendar period ending at `period_end_ms`.
pub(super) fn calendar(period_end_ms: i64) -> Algorithm {
    Algorithm::Calendar { period_end_ms }
}

/// A rolling window of `buckets` buckets of `bucket_ms`.
pub(super) fn rolling(bucket_ms: i64, buckets: i64) -> Algorithm {
    Algorithm::Rolling { bucket_ms, buckets }
}

/// A token bucket refilling `limit` per `period_ms`.
pub(super) fn token_bucket(period_ms: i64) -> Algorithm {
    Algorithm::TokenBucket { period_ms }
}

/// An expected outcome.
pub(super) fn outcome(
    used: u64,
    allowed: bool,
    resets_at_ms: i64,
    retry_at_ms: Option<i64>,
) -> Outcome {
    Outcome {
        used,
        allowed,
        resets_at_ms,
        retry_at_ms,
    }
}
