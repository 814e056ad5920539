//! Redis Sentinel: the service finds the primary through three sentinels and, when the
//! primary is killed, follows the replica they promote without a restart, and never decides
//! on the old primary once it is back (as a replica).

use crate::helpers::{calendar_policy, fresh_settings, spawn_with, CounterBackend, PolicyBackend};
use crate::helpers::{eventually, KeyedLoad, PrivateRedis, TestApp};
use crate::integrity::verify;
use quota_ledger::config::SentinelSettings;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MASTER: &str = "quota-primary";

/// What the sentinels at `sentinel` name as the primary's port.
fn primary_port(sentinel: &PrivateRedis) -> Option<u16> {
    let answer = sentinel.cli(None, &["SENTINEL", "get-master-addr-by-name", MASTER]);
    answer
        .lines()
        .nth(1)
        .and_then(|port| port.trim().parse().ok())
}

/// One answered consume: when, and its status.
type Answered = Arc<Mutex<Vec<(Instant, u16)>>>;

/// Four clients consuming `failover.send` for `u-1` until `stop`.
fn load(app: &Arc<TestApp>, stop: &Arc<AtomicBool>, paused: &Arc<AtomicBool>) -> Answered {
    let answered: Answered = Arc::default();
    for _ in 0..4 {
        let (app, stop, paused, answered) =
            (app.clone(), stop.clone(), paused.clone(), answered.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                if paused.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let status = app.consume("failover.send", "u-1", 1).await.status.as_u16();
                answered.lock().unwrap().push((Instant::now(), status));
            }
        });
    }
    answered
}

/// A primary, its replica and three sentinels that see them and each other.
struct Watched {
    primary: PrivateRedis,
    replica: PrivateRedis,
    sentinels: Vec<PrivateRedis>,
}

impl Watched {
    async fn start() -> Self {
        let primary = PrivateRedis::start().await;
        let replica = PrivateRedis::start_with(
            crate::helpers::free_port(),
            &["--replicaof", "127.0.0.1", &primary.port().to_string()],
        )
        .await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(PrivateRedis::start_sentinel(MASTER, primary.port()).await);
        }
        eventually(
            Duration::from_secs(20),
            "the sentinels see each other and the replica",
            || async {
                let seen = sentinels.iter().all(|s| {
                    let master = s.cli(None, &["SENTINEL", "MASTER", MASTER]);
                    let field = |name: &str| {
                        let lines: Vec<&str> = master.lines().collect();
                        lines
                            .iter()
                            .position(|l| l.trim() == name)
                            .and_then(|i| lines.get(i + 1))
                            .map(|v| v.trim().to_owned())
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                });
                seen.then_some(())
            },
        )
        .await;
        Self {
            primary,
            replica,
            sentinels,
        }
    }

    /// An app that finds the primary through the sentinels, with a day budget of a million
    /// for `failover.send`; `min_replicas`: `QUOTA_REDIS_MIN_REPLICAS`.
    async fn app(&self, policy: PolicyBackend, min_replicas: u32) -> Arc<TestApp> {
        let mut settings = fresh_settings(policy, CounterBackend::Memory).await;
        settings.redis_sentinel = Some(SentinelSettings {
            sentinels: self
                .sentinels
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port()))
                .collect(),
            master: MASTER.to_owned(),
        });
        settings.redis_timeout = Duration::from_millis(500);
        settings.redis_min_replicas = min_replicas;
        let app = Arc::new(spawn_with(settings).await);
        app.must_create_policy(calendar_policy(
            "failover-daily",
            "failover.send",
            1_000_000,
            "day",
            "UTC",
        ))
        .await;
        app
    }

    /// When the sentinels name the replica as the primary.
    async fn switched(&self) -> Instant {
        eventually(
            Duration::from_secs(30),
            "the sentinels promote the replica",
            || async {
                (primary_port(&self.sentinels[0]) == Some(self.replica.port())).then(Instant::now)
            },
        )
        .await
    }
}

#[tokio::test]
async fn the_service_follows_the_promoted_replica_and_never_decides_on_the_old_primary() {
    let mut watched = Watched::start().await;
    let old_port = watched.primary.port();
    let app = watched.app(PolicyBackend::Sqlite, 0).await;
    let (stop, paused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let answered = load(&app, &stop, &paused);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Everything answered so far reached the replica (WAIT), then the primary dies.
    paused.store(true, Ordering::Release);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let acked = watched.primary.cli(None, &["WAIT", "1", "2000"]);
    assert_eq!(acked.trim(), "1", "the replica acknowledged");
    watched.primary.kill_9();
    paused.store(false, Ordering::Release);

    let switched = watched.switched().await;
    let first_served = eventually(
        Duration::from_secs(10),
        "a consume served after the switch",
        || async {
            let answered = answered.lock().unwrap();
            answered
                .iter()
                .find(|(at, status)| *at > switched && *status == 200)
                .map(|(at, _)| *at)
        },
    )
    .await;
    let took = first_served.duration_since(switched);
    assert!(
        took < Duration::from_secs(2),
        "followed the new primary after {took:?}"
    );

    // The old primary comes back (empty, a primary in its own eyes until the sentinels make
    // it a replica): the service goes on deciding on the new primary alone.
    let old = PrivateRedis::start_on(old_port).await;
    // The sentinels' doing, not the service's: on a machine loaded by the whole suite it
    // was once seen to take more than 30 s.
    eventually(
        Duration::from_secs(60),
        "the old primary is made a replica",
        || async {
            old.cli(None, &["ROLE"])
                .lines()
                .next()
                .is_some_and(|role| role.trim() == "slave")
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Release);
    tokio::time::sleep(Duration::from_millis(600)).await;

    let stats = old.cli(None, &["INFO", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_evalsha:") && !stats.contains("cmdstat_eval:"),
        "the old primary ran no script: {stats}"
    );
    let allowed = answered
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| *s == 200)
        .count();
    let usage = app.usage("failover.send", "u-1").await;
    assert_eq!(
        usage.body["policies"][0]["used"].as_u64(),
        Some(allowed as u64),
        "every consume answered 200 is counted on the new primary"
    );
    let verified = verify(&app).await;
    assert_eq!(verified["drift"], serde_json::json!([]), "{verified}");
}

#[tokio::test]
async fn with_replicated_answers_a_sentinel_failover_loses_no_answered_charge() {
    let mut watched = Watched::start().await;
    let old_port = watched.primary.port();
    let app = watched.app(PolicyBackend::Postgres, 1).await;
    let load = KeyedLoad::start(&app, "failover.send", 8);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The replica's link drops just before the primary dies under load.
    watched.replica.pause();
    let dropped = watched
        .primary
        .cli(None, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(dropped.trim(), "1", "the replica's link was dropped");
    tokio::time::sleep(Duration::from_millis(400)).await;
    watched.primary.kill_9();
    watched.replica.resume();
    watched.switched().await;
    // The old primary comes back, as a replica of the new one: with a replica to
    // acknowledge, the service answers again, and its drain moves what waits.
    let old = PrivateRedis::start_on(old_port).await;
    eventually(
        Duration::from_secs(30),
        "a consume served again",
        || async {
            let served = load.served();
            tokio::time::sleep(Duration::from_millis(200)).await;
            (load.served() > served).then_some(())
        },
    )
    .await;
    let answered = load.stop().await;
    KeyedLoad::assert_replayed(&app, "failover.send", &answered).await;
    eventually(
        Duration::from_secs(30),
        "every answered charge is in the ledger",
        || async {
            app.engine.drain_ledger_now().await;
            let verified = verify(&app).await;
            (verified["drift"] == serde_json::json!([])).then_some(())
        },
    )
    .await;
    drop(old);
}
