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

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, RetryMethod, Script, ServerErrorKind, Value};

use super::circuit::CircuitBreaker;
use super::memory::check_charges;
use super::{Algorithm, Charge, CounterStore, Evaluation, Outcome, StoreError};

/// The decision script; its header documents KEYS, ARGV and the reply.
const CONSUME_LUA: &str = include_str!("scripts/consume.lua");

/// Counters in Redis (standalone or cluster), one script call per decision.
#[derive(Clone)]
pub struct RedisCounterStore {
    /// The connection handle, made on first use and then cloned for each call.
    connection: std::sync::Arc<tokio::sync::OnceCell<Connection>>,
    /// How to connect: the node URLs and whether they form a cluster.
    urls: std::sync::Arc<[String]>,
    /// Redis Cluster mode.
    cluster: bool,
    /// Fails calls fast while Redis is down (shared by clones).
    breaker: std::sync::Arc<CircuitBreaker>,
    /// The script, with its SHA1 computed once.
    script: Script,
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
            connection: std::sync::Arc::new(tokio::sync::OnceCell::new()),
            urls: urls.into(),
            cluster,
            breaker: std::sync::Arc::default(),
            script: Script::new(CONSUME_LUA),
            timeout,
        };
        if let Err(error) = store.connection().await {
            tracing::warn!(error = %error, "Redis is not reachable yet; will retry on use");
        }
        Ok(store)
    }

    /// The shared connection, made now if it was not yet.
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
        self.connection
            .get_or_try_init(|| bounded(self.timeout, connecting))
            .await
            .cloned()
    }

    /// The EVALSHA call for one decision. `Cmd` writes every argument into one buffer, sized up
    /// front: two allocations per decision (a `ScriptInvocation` would make one per argument).
    fn consume_cmd(&self, now_ms: i64, charges: &[Charge], commit: bool) -> Cmd {
        let keys: usize = charges.iter().map(|c| c.key.len()).sum();
        let mut call = Cmd::with_capacity(5 + 7 * charges.len(), 64 + keys + 64 * charges.len());
        call.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(charges.len());
        for charge in charges {
            call.arg(charge.key.as_str());
        }
        // ARGV layout (see the script's header): now, commit, then six values per charge.
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
        call
    }

    /// Sends `call`; if the server has lost the script (NOSCRIPT: a restart, a failover, a
    /// `SCRIPT FLUSH`), loads it (on every primary, in a cluster) and sends `call` again.
    async fn run(&self, connection: &mut impl ConnectionLike, call: &Cmd) -> RedisResult<Value> {
        match call.query_async(connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(connection).await?;
                call.query_async(connection).await
            }
            answer => answer,
        }
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
        check_charges(now_ms, charges)?;
        if charges.is_empty() {
            return Ok(Evaluation {
                allowed: true,
                outcomes: Vec::new(),
            });
        }
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable(
                "Redis failed repeatedly; circuit open, retrying shortly".to_owned(),
            ));
        }
        let call = self.consume_cmd(now_ms, charges, commit);
        let reply = async {
            match self.connection().await? {
                Connection::Standalone(mut c) => {
                    bounded(self.timeout, self.run(&mut c, &call)).await
                }
                Connection::Cluster(mut c) => bounded(self.timeout, self.run(&mut c, &call)).await,
            }
        }
        .await;
        match &reply {
            Err(StoreError::Unavailable(_)) => self.breaker.failed(),
            _ => self.breaker.succeeded(),
        }
        parse_reply(reply?, charges)
    }

    fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        // In cluster mode PING goes to every primary and succeeds only if all answer.
        let _: Value = match self.connection().await? {
            Connection::Standalone(mut c) => {
                bounded(self.timeout, ping.query_async(&mut c)).await?
            }
            Connection::Cluster(mut c) => bounded(self.timeout, ping.query_async(&mut c)).await?,
        };
        Ok(())
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
        Err(_) => Err(StoreError::Unavailable(format!(
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
