//! The Redis counter store: one `scripts/consume.lua` call (EVALSHA) per decision.
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

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, RetryMethod, Script, ServerErrorKind, Value};

use super::circuit::CircuitBreaker;
use crate::engine::codec;
use crate::engine::store::{
    check_charges, Algorithm, Charge, CounterStore, Decided, Effects, Evaluation, GiveBack,
    GiveBackKind, GivenBack, Outcome, Restore, StoreError,
};

/// The decision script; its header documents KEYS, ARGV and the reply.
const CONSUME_LUA: &str = include_str!("scripts/consume.lua");

/// The give-back script (refunds, hold settlement); its header documents KEYS and ARGV.
const GIVEBACK_LUA: &str = include_str!("scripts/giveback.lua");

/// A connection made on first use, then cloned for each call.
type Slot = Arc<tokio::sync::OnceCell<Connection>>;

thread_local! {
    /// This thread's connection to each live store, by the store's `id`. A store that is
    /// dropped leaves a dead entry, removed when this thread next adds one.
    static SLOTS: RefCell<Vec<(Weak<()>, Slot)>> = const { RefCell::new(Vec::new()) };
}

/// Counters in Redis (standalone or cluster), one script call per decision.
#[derive(Clone)]
pub struct RedisCounterStore {
    /// Names this store and its clones in every thread's [`SLOTS`].
    id: Arc<()>,
    /// How to connect: the node URLs and whether they form a cluster.
    urls: Arc<[String]>,
    /// Redis Cluster mode.
    cluster: bool,
    /// Fails calls fast while Redis is down (shared by clones).
    breaker: std::sync::Arc<CircuitBreaker>,
    /// The decision script, with its SHA1 computed once.
    script: Script,
    /// The give-back script.
    giveback: Script,
    /// Upper bound for one call, connection set-up included.
    timeout: Duration,
}

/// The two kinds of Redis deployments, behind one handle.
#[derive(Clone)]
enum Connection {
    /// One server (or a proxy in front of several).
    Standalone(ConnectionManager),
    /// Redis Cluster: commands are routed by the hash slot of their first key.
    Cluster(ClusterConnection),
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
        for url in urls {
            redis::Client::open(url.as_str()).map_err(|e| classify(&e))?;
        }
        let store = Self {
            id: Arc::new(()),
            urls: urls.into(),
            cluster,
            breaker: std::sync::Arc::default(),
            script: Script::new(CONSUME_LUA),
            giveback: Script::new(GIVEBACK_LUA),
            timeout,
        };
        if let Err(error) = store.connection().await {
            tracing::warn!(error = %error, "Redis is not reachable yet; will retry on use");
        }
        Ok(store)
    }

    /// This thread's slot for its connection to this store.
    fn slot(&self) -> Slot {
        SLOTS.with(|slots| {
            let mut slots = slots.borrow_mut();
            let id = Arc::as_ptr(&self.id);
            if let Some((_, slot)) = slots.iter().find(|(owner, _)| owner.as_ptr() == id) {
                return slot.clone();
            }
            slots.retain(|(owner, _)| owner.strong_count() > 0);
            let slot = Slot::default();
            slots.push((Arc::downgrade(&self.id), slot.clone()));
            slot
        })
    }

    /// This thread's connection, made now if it was not yet.
    async fn connection(&self) -> Result<Connection, StoreError> {
        let connecting = async {
            if self.cluster {
                let client = ClusterClientBuilder::new(self.urls.iter().map(String::as_str))
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .build()?;
                Ok(Connection::Cluster(client.get_async_connection().await?))
            } else {
                let client = redis::Client::open(self.urls[0].as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout));
                Ok(Connection::Standalone(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
        };
        // Not connected within the deadline means unreachable, whatever the reason.
        let connect = || async {
            bounded(self.timeout, connecting)
                .await
                .map_err(|e| match e {
                    StoreError::Timeout(why) => {
                        StoreError::Unavailable(format!("connecting: {why}"))
                    }
                    other => other,
                })
        };
        self.slot().get_or_try_init(connect).await.cloned()
    }

    /// The EVALSHA call for one decision. `Cmd` writes every argument into one buffer, sized up
    /// front: two allocations per decision (a `ScriptInvocation` would make one per argument).
    fn consume_cmd(&self, now_ms: i64, charges: &[Charge], commit: bool, effects: &Effects) -> Cmd {
        let keys: usize = charges.iter().map(|c| c.key.len()).sum();
        let extra = effects.ledger.as_ref().map_or(0, |l| l.allowed.len() + 64)
            + effects
                .idempotency
                .as_ref()
                .map_or(0, |i| i.record.len() + i.key.len())
            + effects.hold.as_ref().map_or(0, |h| h.record.len() + 128);
        let mut call = Cmd::with_capacity(
            16 + 7 * charges.len(),
            128 + keys + 64 * charges.len() + extra,
        );
        let extra_keys = usize::from(effects.idempotency.is_some())
            + usize::from(effects.ledger.is_some())
            + 2 * usize::from(effects.hold.is_some());
        call.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(charges.len() + extra_keys);
        for charge in charges {
            call.arg(charge.key.as_str());
        }
        if let Some(idem) = &effects.idempotency {
            call.arg(idem.key.as_str());
        }
        if let Some(ledger) = &effects.ledger {
            call.arg(ledger.stream.as_str());
        }
        if let Some(hold) = &effects.hold {
            call.arg(hold.record_key.as_str())
                .arg(hold.index_key.as_str());
        }
        // ARGV layout (see the script's header): now, commit, six values per charge, effects.
        call.arg(now_ms).arg(u8::from(commit));
        for charge in charges {
            let (kind, p1, p2) = match charge.algorithm {
                Algorithm::Calendar { period_end_ms } => (1, period_end_ms, 0),
                Algorithm::Rolling { bucket_ms, buckets } => (2, bucket_ms, buckets),
                Algorithm::TokenBucket { period_ms } => (3, period_ms, 0),
            };
            call.arg(kind)
                .arg(p1)
                .arg(p2)
                .arg(charge.limit)
                .arg(charge.cost)
                .arg(u8::from(charge.enforce));
        }
        let flag = |on: bool| if on { '1' } else { '0' };
        let flags: String = [
            flag(effects.idempotency.is_some()),
            flag(effects.ledger.is_some()),
            flag(effects.hold.is_some()),
        ]
        .into_iter()
        .collect();
        call.arg(flags);
        match &effects.idempotency {
            Some(idem) => call.arg(idem.ttl_ms).arg(idem.record.as_str()),
            None => call.arg("").arg(""),
        };
        match &effects.ledger {
            Some(ledger) => call
                .arg(ledger.allowed.as_str())
                .arg(ledger.denied.as_deref().unwrap_or("")),
            None => call.arg("").arg(""),
        };
        match &effects.hold {
            Some(hold) => call
                .arg(hold.hold_id.as_str())
                .arg(hold.expires_at_ms)
                .arg(hold.record.as_str())
                .arg(hold.ttl_ms),
            None => call.arg("").arg("").arg("").arg(""),
        };
        call
    }

    /// The EVALSHA call of the give-back script.
    fn giveback_cmd(&self, now_ms: i64, request: &GiveBack) -> Cmd {
        let mut call = Cmd::with_capacity(24 + 7 * request.counters.len(), 1024);
        let extra_keys = usize::from(request.hold_index.is_some())
            + usize::from(request.ledger.is_some())
            + usize::from(request.idempotency.is_some());
        call.arg("EVALSHA")
            .arg(self.giveback.get_hash())
            .arg(request.counters.len() + 1 + extra_keys);
        for counter in &request.counters {
            call.arg(counter.key.as_str());
        }
        call.arg(request.control_key.as_str());
        if let Some((index, _)) = &request.hold_index {
            call.arg(index.as_str());
        }
        if let Some((stream, _)) = &request.ledger {
            call.arg(stream.as_str());
        }
        if let Some(idem) = &request.idempotency {
            call.arg(idem.key.as_str());
        }
        let (op, total, amount, refunded, hold_expiry) = match request.kind {
            GiveBackKind::Refund {
                amount,
                total,
                refunded,
            } => ("r", total, amount, refunded, 0),
            GiveBackKind::Commit {
                settle,
                total,
                expires_at_ms,
            } => ("c", total, settle, 0, expires_at_ms),
            GiveBackKind::Release {
                total,
                expires_at_ms,
            } => ("l", total, 0, 0, expires_at_ms),
            GiveBackKind::Expire {
                total,
                expires_at_ms,
            } => ("x", total, 0, 0, expires_at_ms),
        };
        call.arg(now_ms)
            .arg(op)
            .arg(request.counters.len())
            .arg(total)
            .arg(amount)
            .arg(refunded)
            .arg(hold_expiry)
            .arg(
                request
                    .hold_index
                    .as_ref()
                    .map_or("", |(_, id)| id.as_str()),
            )
            .arg(
                request
                    .ledger
                    .as_ref()
                    .map_or("", |(_, entry)| entry.as_str()),
            );
        match &request.idempotency {
            Some(idem) => call.arg(idem.ttl_ms).arg(idem.record.as_str()),
            None => call.arg(0).arg(""),
        };
        let flag = |on: bool| u8::from(on);
        call.arg(flag(request.hold_index.is_some()))
            .arg(flag(request.ledger.is_some()))
            .arg(flag(request.idempotency.is_some()));
        for counter in &request.counters {
            let (kind, p1, p2, p3) = match counter.restore {
                Restore::Calendar => (1, 0, 0, 0),
                Restore::Rolling {
                    bucket,
                    bucket_ms,
                    buckets,
                } => (2, bucket, bucket_ms, buckets),
                Restore::TokenBucket { period_ms, limit } => (3, period_ms, limit as i64, 0),
            };
            call.arg(kind)
                .arg(p1)
                .arg(p2)
                .arg(p3)
                .arg(u8::from(counter.by_amount))
                .arg(counter.charged);
        }
        call
    }

    /// Runs `call` of `script` under the circuit breaker and the timeout.
    async fn exec(&self, script: &Script, call: &Cmd) -> Result<Value, StoreError> {
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable(
                "Redis failed repeatedly; circuit open, retrying shortly".to_owned(),
            ));
        }
        let reply = async {
            match self.connection().await? {
                Connection::Standalone(mut c) => {
                    bounded(self.timeout, run(script, &mut c, call)).await
                }
                Connection::Cluster(mut c) => {
                    bounded(self.timeout, run(script, &mut c, call)).await
                }
            }
        }
        .await;
        match &reply {
            Err(error) if error.is_transient() => self.breaker.failed(),
            _ => self.breaker.succeeded(),
        }
        reply
    }

    /// Runs a plain command (no script) under the timeout (for the ledger drain).
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        call: &Cmd,
    ) -> Result<T, StoreError> {
        self.plain(call).await
    }

    /// Runs a plain command (no script) under the timeout.
    async fn plain<T: redis::FromRedisValue>(&self, call: &Cmd) -> Result<T, StoreError> {
        match self.connection().await? {
            Connection::Standalone(mut c) => bounded(self.timeout, call.query_async(&mut c)).await,
            Connection::Cluster(mut c) => bounded(self.timeout, call.query_async(&mut c)).await,
        }
    }
}

/// Sends `call`; if the server has lost `script` (NOSCRIPT: a restart, a failover, a
/// `SCRIPT FLUSH`), loads it (on every primary, in a cluster) and sends `call` again.
async fn run(
    script: &Script,
    connection: &mut impl ConnectionLike,
    call: &Cmd,
) -> RedisResult<Value> {
    match call.query_async(connection).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(connection).await?;
            call.query_async(connection).await
        }
        answer => answer,
    }
}

#[async_trait]
impl CounterStore for RedisCounterStore {
    async fn evaluate(
        &self,
        now_ms: i64,
        charges: &[Charge],
        commit: bool,
    ) -> Result<Evaluation, StoreError> {
        match self
            .decide(now_ms, charges, commit, &Effects::default())
            .await?
        {
            Decided::Fresh(evaluation) => Ok(evaluation),
            Decided::Replayed { evaluation, .. } => Ok(evaluation),
        }
    }

    async fn decide(
        &self,
        now_ms: i64,
        charges: &[Charge],
        commit: bool,
        effects: &Effects,
    ) -> Result<Decided, StoreError> {
        check_charges(now_ms, charges)?;
        if charges.is_empty() {
            return Ok(Decided::Fresh(Evaluation {
                allowed: true,
                outcomes: Vec::new(),
            }));
        }
        let call = self.consume_cmd(now_ms, charges, commit, effects);
        let reply = self.exec(&self.script, &call).await?;
        parse_decided(reply, charges)
    }

    async fn give_back(&self, now_ms: i64, request: &GiveBack) -> Result<GivenBack, StoreError> {
        let call = self.giveback_cmd(now_ms, request);
        let reply = self.exec(&self.giveback, &call).await?;
        parse_given_back(reply)
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

    async fn record(&self, record_key: &str, _now_ms: i64) -> Result<Option<String>, StoreError> {
        let mut call = redis::cmd("GET");
        call.arg(record_key);
        self.plain(&call).await
    }

    fn streams_ledger(&self) -> bool {
        true
    }

    fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // In cluster mode PING goes to every primary and succeeds only if all answer.
        let _: Value = self.plain(&redis::cmd("PING")).await?;
        Ok(())
    }
}

/// Reads the consume script's reply: a replay (`[-1, record]`) or a fresh evaluation.
fn parse_decided(reply: Value, charges: &[Charge]) -> Result<Decided, StoreError> {
    if let Value::Array(items) = &reply {
        if let [Value::Int(-1), kept] = items.as_slice() {
            let text = match kept {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => {
                    return Err(StoreError::Protocol(
                        "consume.lua replayed a non-string".into(),
                    ))
                }
            };
            return codec::decode_replay(&text);
        }
    }
    parse_reply(reply, charges).map(Decided::Fresh)
}

/// Reads the give-back script's reply `[status, value]`.
fn parse_given_back(reply: Value) -> Result<GivenBack, StoreError> {
    let unexpected = |what: &str| StoreError::Protocol(format!("giveback.lua replied {what}"));
    let Value::Array(items) = reply else {
        return Err(unexpected("something other than an array"));
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::Int(n) => Ok(n.to_string()),
        _ => Err(unexpected("an unexpected value")),
    };
    match items.as_slice() {
        [Value::Int(1), Value::Int(total)] => Ok(GivenBack::Done {
            refunded: u64::try_from(*total).unwrap_or(0),
        }),
        [Value::Int(2), value] => Ok(GivenBack::Conflict(text(value)?)),
        [Value::Int(3), value] => Ok(GivenBack::Replayed(text(value)?)),
        [Value::Int(4), _] => Ok(GivenBack::Unknown),
        _ => Err(unexpected("an unknown status")),
    }
}

/// Runs one Redis exchange with a deadline, classifying its failure.
async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(classify(&error)),
        Err(_) => Err(StoreError::Timeout(format!(
            "no answer from Redis within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// A refusal by the server of the request itself (a script error, WRONGTYPE, CROSSSLOT,
/// NOPERM, a malformed URL) is a bug: `Protocol`. Everything else is transient and worth
/// retrying: I/O errors, timeouts, a dropped or corrupted connection, failover (MOVED, TRYAGAIN,
/// CLUSTERDOWN, READONLY), LOADING, BUSY, OOM: `Unavailable`.
fn classify(error: &RedisError) -> StoreError {
    let refused = match error.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => {
            matches!(error.retry_method(), RetryMethod::NoRetry)
                && !matches!(
                    error.code(),
                    Some("BUSY" | "OOM" | "LOADING" | "MASTERDOWN" | "NOREPLICAS" | "MISCONF")
                )
        }
        ErrorKind::InvalidClientConfig | ErrorKind::UnexpectedReturnType => true,
        _ => false,
    };
    match refused {
        true => StoreError::Protocol(error.to_string()),
        false if error.is_timeout() => StoreError::Timeout(error.to_string()),
        false => StoreError::Unavailable(error.to_string()),
    }
}

/// Reads the script's reply: `[allowed_all, (used, allowed, resets_at, retry_at) per charge]`.
fn parse_reply(reply: Value, charges: &[Charge]) -> Result<Evaluation, StoreError> {
    let unexpected = |what: &str| StoreError::Protocol(format!("consume.lua replied {what}"));
    let Value::Array(items) = reply else {
        return Err(unexpected("something other than an array"));
    };
    if items.len() != 1 + 4 * charges.len() {
        return Err(unexpected("an array of the wrong length"));
    }
    let mut numbers = items.into_iter().map(|item| match item {
        Value::Int(n) => Ok(n),
        _ => Err(unexpected("a non-integer element")),
    });
    let mut next = move || {
        numbers
            .next()
            .unwrap_or_else(|| Err(unexpected("too few elements")))
    };
    let flag = |n: i64| match n {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(unexpected("a flag other than 0 or 1")),
    };
    let allowed = flag(next()?)?;
    let mut outcomes = Vec::with_capacity(charges.len());
    for charge in charges {
        let used = u64::try_from(next()?).map_err(|_| unexpected("a negative usage"))?;
        let passes = flag(next()?)?;
        let resets_at_ms = next()?;
        let retry_at_ms = next()?;
        outcomes.push(Outcome {
            used,
            allowed: passes,
            resets_at_ms,
            // The -1 placeholder is never read: cost and limit tell whether there is a time.
            retry_at_ms: (!passes && charge.cost <= charge.limit).then_some(retry_at_ms),
        });
    }
    Ok(Evaluation { allowed, outcomes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_charge() -> Vec<Charge> {
        vec![Charge {
            key: "k".to_owned(),
            algorithm: Algorithm::Calendar { period_end_ms: 10 },
            limit: 5,
            cost: 1,
            enforce: true,
        }]
    }

    #[test]
    fn a_well_formed_reply_becomes_an_evaluation() {
        let reply = Value::Array([0, 5, 0, 10, 10].map(Value::Int).to_vec());
        let evaluation = parse_reply(reply, &one_charge()).expect("parses");
        let denied = Outcome {
            used: 5,
            allowed: false,
            resets_at_ms: 10,
            retry_at_ms: Some(10),
        };
        assert_eq!(
            evaluation,
            Evaluation {
                allowed: false,
                outcomes: vec![denied]
            }
        );
    }

    #[test]
    fn replies_of_the_wrong_shape_are_protocol_errors() {
        let replies = [
            Value::Okay,
            Value::Array([1, 5, 1, 10].map(Value::Int).to_vec()),
            Value::Array([1, 5, 2, 10, -1].map(Value::Int).to_vec()),
            Value::Array([1, -5, 1, 10, -1].map(Value::Int).to_vec()),
            Value::Array(vec![
                Value::Int(1),
                Value::Nil,
                Value::Int(1),
                Value::Int(0),
                Value::Int(-1),
            ]),
        ];
        for reply in replies {
            let error = parse_reply(reply.clone(), &one_charge());
            assert!(
                matches!(error, Err(StoreError::Protocol(_))),
                "{reply:?}: {error:?}"
            );
        }
    }

    #[test]
    fn transport_failures_are_unavailable_and_refusals_are_protocol_errors() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(classify(&io), StoreError::Unavailable(_)));
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "bad URL"));
        assert!(matches!(classify(&config), StoreError::Protocol(_)));
    }

    #[tokio::test]
    async fn a_closed_port_starts_the_store_but_every_call_is_unavailable_within_the_timeout() {
        let started = std::time::Instant::now();
        let urls = ["redis://127.0.0.1:1/".to_owned()];
        let store = RedisCounterStore::connect(&urls, false, Duration::from_millis(500))
            .await
            .expect("an unreachable server is not a configuration error");
        let result = store.ping().await;
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "{result:?}"
        );
        let result = store.evaluate(0, &one_charge(), true).await;
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
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
