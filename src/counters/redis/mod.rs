//! The Redis counter store: one `script/consume.lua` call (EVALSHA) per decision.
//!
//! The script reads every counter of the decision, decides, and writes all of them or none,
//! atomically, in one round trip: EVALSHA with the SHA1 that `redis::Script` computed once;
//! when the server answers NOSCRIPT (after a restart, a failover or `SCRIPT FLUSH`) the script
//! is loaded and the call sent again.
//!
//! Standalone Redis is reached through a `ConnectionManager` (one multiplexed connection that
//! reconnects by itself) and Redis Cluster through a `ClusterConnection`; both are cheap
//! handles that every call clones, so requests never wait on a lock of ours. Every call is
//! bounded by the configured timeout: a slow or absent Redis is `StoreError::Unavailable`
//! (the engine answers 503 or fails open), never a hung request.
//!
//! Each thread that uses the store gets its own connection, made on its first call. An actix
//! worker is one thread with its own runtime, so the task that drives its connection runs on
//! the same thread as the requests it carries: a decision and its reply never cross threads
//! (with one shared connection, every call woke the thread that drove it and was woken back,
//! two cross-thread wake-ups per decision), and the concurrent decisions of one worker are
//! pipelined on its connection.

mod batch;
mod call;
mod connection;
mod cut;
mod generations;
mod info;
mod replicas;
mod script;
mod shards;
mod stream;
mod target;
mod time;
mod totals;

pub use target::{Certificates, Target};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{ErrorKind, RedisError, Script, Value};
use tracing::Instrument;

use call::{classify, duration_ms};
use connection::{Connection, Refusal};
use info::store_memory;

use super::circuit::CircuitBreaker;
use crate::engine::load::Load;
use crate::engine::pipeline::drain::Appends;
use crate::engine::store::{
    check_charges, AcrossSlots, Charge, Consume, CounterStore, Decided, Effects, Evaluation,
    Finalize, Finalized, GiveBack, GivenBack, StoreError, StoreMemory,
};

/// What becomes of a refund, settlement or expiry that the replicas did not acknowledge.
const GIVE_BACK_IN_DOUBT: &str = "the refund or settlement may or may not stand, as after a \
     timeout: retry it (a refund with its idempotency key)";

/// Takes the lease, or extends it for its holder; its header documents KEYS, ARGV and the reply.
const LEASE_LUA: &str = include_str!("script/lease.lua");

/// Gives a lease up if its holder asks; its header documents KEYS, ARGV and the reply.
const RELEASE_LUA: &str = include_str!("script/release.lua");

/// Counters in Redis (standalone or cluster), one script call per decision.
#[derive(Clone)]
pub struct RedisCounterStore {
    /// Names this store and its clones in every thread's [`SLOTS`].
    id: Arc<()>,
    /// How to connect: one server, a cluster, or the primary Sentinel names; TLS.
    target: Target,
    /// Redis Cluster mode.
    cluster: bool,
    /// Fails calls fast while Redis is down (shared by clones).
    breaker: std::sync::Arc<CircuitBreaker>,
    /// The decision script, with its SHA1 computed once.
    script: Script,
    /// Several decisions in one call (`batch.rs`), and how many went so.
    batch: Script,
    batched: Arc<batch::Batched>,
    /// The give-back script.
    giveback: Script,
    /// The commit point of a consume across cluster slots.
    finalize: Script,
    /// The script that writes a shard's state rebuilt from the ledger.
    restore: Script,
    /// The script that reads a record unless its shard has no epoch.
    record: Script,
    /// The prefix of every key (`QUOTA_REDIS_PREFIX`): shards' epochs and locks.
    prefix: String,
    /// The floors of the shards' write generations (`generations.rs`), shared by clones
    /// and raised by the drain; with them, every script checks its shards' epochs and
    /// generations. `None` only in the counting conformance suite, whose keys belong to no
    /// shard.
    floors: Option<Arc<generations::Floors>>,
    /// Upper bound for one call, connection set-up included.
    timeout: Duration,
    /// The instance's load signal, if the breaker is to hear of it.
    load: Option<Arc<Load>>,
    /// Serve even if Redis may evict keys (`QUOTA_REDIS_ALLOW_EVICTION`).
    allow_eviction: bool,
    /// Why scripts are refused, while Redis's eviction policy is unsafe (shared by clones).
    refusal: Arc<Refusal>,
    /// Told of every call that may have appended to a ledger stream.
    appends: Option<Arc<Appends>>,
    /// A connection of its own for `counters verify`'s long reads (`cut.rs`), made on the
    /// first (and again for a new primary): they would time out on the decisions'
    /// connection, and hold it up.
    slow: Arc<std::sync::Mutex<(u64, connection::Slot)>>,
    /// Redis's time as this instance measures it (`time.rs`); `None`: this machine's clock.
    time: Option<Arc<crate::clock::OffsetClock>>,
    /// On a cluster, the offset of each shard's primary (`time.rs`): the call deadlines its
    /// scripts check on their own node's clock.
    node_offsets: Option<Arc<time::NodeOffsets>>,
    /// Replicas that must acknowledge a decision that charged before it is answered
    /// (`QUOTA_REDIS_MIN_REPLICAS`, `replicas.rs`).
    min_replicas: u32,
}

impl std::fmt::Debug for RedisCounterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.cluster {
            false => "standalone",
            true => "cluster",
        };
        f.debug_struct("RedisCounterStore")
            .field("mode", &mode)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisCounterStore {
    /// Prepares the store for one Redis (`cluster == false`, exactly one URL) or a Redis
    /// Cluster (`cluster == true`, any of its nodes); `timeout` bounds every call.
    ///
    /// A wrong URL fails here. An unreachable server does not: the service starts, reports
    /// not-ready, answers 503 (or degraded) and connects as soon as Redis answers. Once made,
    /// the connection is re-established in the background by the redis client.
    pub async fn connect(
        urls: &[String],
        cluster: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if !cluster && urls.len() != 1 {
            return Err(classify(&RedisError::from((
                ErrorKind::InvalidClientConfig,
                "standalone Redis takes exactly one URL (set cluster mode for several)",
            ))));
        }
        let target = match cluster {
            true => Target::cluster(urls),
            false => Target::standalone(&urls[0]),
        }
        .map_err(|e| StoreError::Protocol(format!("{e:#}")))?;
        Self::reaching(target, timeout).await
    }

    /// Prepares the store for `target`; `timeout` bounds every call.
    ///
    /// A certificate that does not verify fails here (the start stops, naming the
    /// reason). An unreachable server does not: the service starts, reports not-ready,
    /// answers 503 (or degraded) and connects as soon as Redis answers. Once made, the
    /// connection is re-established in the background by the redis client, and with
    /// Sentinel made again whenever the sentinels name another primary.
    pub async fn reaching(target: Target, timeout: Duration) -> Result<Self, StoreError> {
        let store = Self {
            id: Arc::new(()),
            cluster: target.is_cluster(),
            target,
            breaker: std::sync::Arc::default(),
            script: Script::new(script::consume::LUA),
            batch: batch::script(),
            batched: Arc::default(),
            giveback: Script::new(script::giveback::LUA),
            finalize: Script::new(script::finalize::LUA),
            restore: Script::new(shards::RESTORE_LUA),
            record: Script::new(include_str!("script/record.lua")),
            prefix: String::new(),
            floors: Some(Arc::default()),
            timeout,
            load: None,
            allow_eviction: false,
            refusal: Arc::default(),
            appends: None,
            slow: Arc::default(),
            time: None,
            node_offsets: None,
            min_replicas: 0,
        };
        store.target.follow();
        store.first_connection().await?;
        Ok(store)
    }

    /// The store, with its circuit breaker told when this instance sheds load: timeouts
    /// meanwhile are not counted against Redis.
    pub fn judged_by(mut self, load: Arc<Load>) -> Self {
        self.load = Some(load);
        self
    }

    /// The store, with the keys of its shards (epochs, rebuild locks) under `prefix`.
    pub fn prefixed(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// How many decisions went in calls that carried several (`batch.rs`).
    #[cfg(test)]
    pub(crate) fn batched_decisions(&self) -> u64 {
        self.batched.count()
    }

    /// The store without the shards' epochs, for the counting conformance suite.
    #[cfg(test)]
    pub(crate) fn without_epochs(mut self) -> Self {
        self.floors = None;
        self
    }

    /// The store, serving even on a Redis whose `maxmemory-policy` may evict keys (a
    /// warning is logged instead of every call being refused).
    pub fn allowing_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// The store, reporting to `appends` every call that may have appended to a ledger
    /// stream (the drain wakes for it).
    pub fn reporting_to(mut self, appends: Arc<Appends>) -> Self {
        self.appends = Some(appends);
        self
    }

    /// A script call that carried `stream` (if any) is over: it may have appended there,
    /// even if its answer was lost.
    fn may_have_appended(&self, stream: Option<&str>) {
        let shard = stream.and_then(|s| crate::keys::shard_of_tag(crate::keys::hash_tag(s)));
        if let (Some(appends), Some(shard)) = (&self.appends, shard) {
            appends.appended(shard);
        }
    }
}

#[async_trait]
impl AcrossSlots for RedisCounterStore {
    async fn finalize(&self, now_ms: i64, request: &Finalize) -> Result<Finalized, StoreError> {
        let call =
            script::finalize::command(&self.finalize, now_ms, request, self.floors.as_deref());
        let reply = self
            .exec_on(&self.finalize, &call)
            .instrument(connection::redis_span("redis EVALSHA"))
            .await;
        let appended = request.effects.ledger.as_ref();
        self.may_have_appended(appended.map(|l| l.stream.as_str()));
        let (reply, connection) = reply?;
        let finalized = script::finalize::finalized(reply, &request.intent.key)?;
        // The consume is answered once its home commit is on the replicas; when it is not,
        // the committed intent is in doubt, voided like any consume answered 503.
        if finalized == Finalized::Committed && self.min_replicas > 0 {
            self.replicated(connection, &request.intent.key, "the charge is given back")
                .await?;
        }
        Ok(finalized)
    }
}

#[async_trait]
impl CounterStore for RedisCounterStore {
    fn store_now_ms(&self) -> i64 {
        self.redis_now_ms()
    }

    async fn evaluate(
        &self,
        now_ms: i64,
        charges: &[Charge],
        commit: bool,
    ) -> Result<Evaluation, StoreError> {
        match self
            .decide(&Consume {
                now_ms,
                charges,
                commit,
                effects: &Effects::default(),
            })
            .await?
        {
            Decided::Fresh(evaluation) => Ok(evaluation),
            Decided::Replayed { evaluation, .. } => Ok(evaluation),
            Decided::Refused | Decided::InFlight => Err(StoreError::Protocol(
                "a reservation refused without one".to_owned(),
            )),
        }
    }

    async fn decide(&self, call: &Consume<'_>) -> Result<Decided, StoreError> {
        let (charges, effects, commit) = (call.charges, call.effects, call.commit);
        check_charges(call.now_ms, charges, !self.cluster)?;
        if charges.is_empty() && effects.hold.is_none() && effects.intent.is_none() {
            return Ok(Decided::Fresh(Evaluation {
                allowed: true,
                outcomes: Vec::new(),
            }));
        }
        // A call that changes state carries the moment this instance stops waiting for it:
        // Redis refuses to run it later than that (plus the clocks' skew), so that an
        // attempt answered 503 is settled, applied or not, soon after (`engine::recovery::void`).
        let node = match (charges.first(), &effects.ledger) {
            (Some(charge), _) => charge.key.as_str(),
            (None, Some(ledger)) => ledger.stream.as_str(),
            (None, None) => "",
        };
        let deadline = commit.then(|| self.node_now_ms(node) + duration_ms(self.timeout));
        let command =
            script::consume::command(&self.script, call, (self.floors.as_deref(), deadline));
        let reply = self
            .exec_decision(command)
            .instrument(connection::redis_span("redis EVALSHA"))
            .await;
        self.may_have_appended(effects.ledger.as_ref().map(|l| l.stream.as_str()));
        let (reply, connection) = reply?;
        let decided = script::consume::decided(reply, charges)?;
        let charged = matches!(&decided, Decided::Fresh(evaluation) if evaluation.allowed);
        if commit && charged && self.min_replicas > 0 {
            self.replicated(connection, node, "the charge is given back")
                .await?;
        }
        Ok(decided)
    }

    async fn give_back(&self, now_ms: i64, request: &GiveBack) -> Result<GivenBack, StoreError> {
        let call =
            script::giveback::command(&self.giveback, now_ms, request, self.floors.as_deref());
        let reply = self
            .exec_on(&self.giveback, &call)
            .instrument(connection::redis_span("redis EVALSHA"))
            .await;
        self.may_have_appended(request.ledger.as_ref().map(|(stream, _)| stream.as_str()));
        let (reply, connection) = reply?;
        let given = script::giveback::given_back(reply, &request.control_key)?;
        // A refund or a settlement is answered once the replicas hold it, as a charge is:
        // when they do not in time, it is in doubt like a call that timed out (a retry
        // with its idempotency key replays it, or applies it once on a promoted replica).
        if matches!(given, GivenBack::Done { .. }) && self.min_replicas > 0 {
            self.replicated(connection, &request.control_key, GIVE_BACK_IN_DOUBT)
                .await?;
        }
        Ok(given)
    }

    async fn expired_holds(
        &self,
        index_key: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut call = redis::cmd("ZRANGEBYSCORE");
        call.arg(index_key)
            .arg("-inf")
            .arg(now_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        self.plain(&call).await
    }

    async fn next_due(&self, index_key: &str) -> Result<Option<i64>, StoreError> {
        let mut call = redis::cmd("ZRANGE");
        call.arg(index_key).arg(0).arg(0).arg("WITHSCORES");
        let first: Vec<(String, f64)> = self.plain(&call).await?;
        // Scores are whole milliseconds, well within f64's exact integers.
        Ok(first.first().map(|(_, score)| *score as i64))
    }

    async fn lease(&self, key: &str, owner: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        // Sent whole (EVAL, not EVALSHA) every few seconds: no script cache to miss, and
        // not refused with the scripts while Redis's eviction policy is unsafe.
        let mut call = redis::cmd("EVAL");
        call.arg(LEASE_LUA).arg(1).arg(key).arg(owner).arg(ttl_ms);
        let held: i64 = self.plain(&call).await?;
        Ok(held == 1)
    }

    async fn release(&self, key: &str, owner: &str) -> Result<(), StoreError> {
        let mut call = redis::cmd("EVAL");
        call.arg(RELEASE_LUA).arg(1).arg(key).arg(owner);
        let _: i64 = self.plain(&call).await?;
        Ok(())
    }

    async fn record(&self, record_key: &str, _now_ms: i64) -> Result<Option<String>, StoreError> {
        let mut call = redis::cmd("EVALSHA");
        call.arg(self.record.get_hash())
            .arg(1 + usize::from(self.floors.is_some()))
            .arg(record_key);
        if self.floors.is_some() {
            call.arg(crate::keys::epoch_of(record_key));
        }
        match self.exec(&self.record, &call).await? {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Value::Int(-2) => Err(StoreError::Rebuilding {
                shard: crate::keys::shard_of_tag(crate::keys::hash_tag(record_key)).unwrap_or(0),
            }),
            other => Err(StoreError::Protocol(format!(
                "record.lua replied {other:?}"
            ))),
        }
    }

    fn call_timeout(&self) -> Duration {
        self.timeout
    }

    fn across_slots(&self) -> Option<&dyn AcrossSlots> {
        self.cluster.then_some(self as &dyn AcrossSlots)
    }
    fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    fn decision_calls(&self) -> Option<crate::engine::store::DecisionCalls> {
        Some(self.batched.calls())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        if let Some(why) = self.refusal.get() {
            return Err(StoreError::Misconfigured(why));
        }
        // In cluster mode PING goes to every primary and succeeds only if all answer.
        let _: Value = self.plain(&redis::cmd("PING")).await?;
        self.enough_replicas().await
    }

    async fn memory(&self) -> Option<StoreMemory> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply: Value = self.plain(&info).await.ok()?;
        let memory = store_memory(&reply);
        // A look at the policy, besides the one on every new connection: a setting changed
        // on a live server, or a node that came back from a failover, is judged here.
        self.refusal.judged(&self.judge(&memory.policies));
        static UNBOUNDED: std::sync::Once = std::sync::Once::new();
        if memory.max_bytes == 0 {
            UNBOUNDED.call_once(|| {
                tracing::warn!(
                    used_bytes = memory.used_bytes,
                    "Redis has no maxmemory: a long ledger outage or a flood of subjects can \
                     exhaust the host's memory and get Redis killed with every counter; set \
                     maxmemory with headroom (and keep maxmemory-policy noeviction)"
                );
            });
        }
        Some(memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_starts_the_store_but_every_call_is_unavailable_within_the_timeout() {
        let started = std::time::Instant::now();
        let urls = ["redis://127.0.0.1:1/".to_owned()];
        let store = RedisCounterStore::connect(&urls, false, Duration::from_millis(500))
            .await
            .expect("an unreachable server is not a configuration error");
        let result = store.ping().await;
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::NotConnected(_))
            ),
            "{result:?}"
        );
        let result = store.evaluate(0, &script::tests::one_charge(), true).await;
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::NotConnected(_))
            ),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn standalone_mode_takes_exactly_one_url() {
        let urls = [
            "redis://127.0.0.1:1/".to_owned(),
            "redis://127.0.0.1:2/".to_owned(),
        ];
        let result = RedisCounterStore::connect(&urls, false, Duration::from_millis(500)).await;
        assert!(matches!(result, Err(StoreError::Protocol(_))), "{result:?}");
    }
}
