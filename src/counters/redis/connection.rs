//! Connections to Redis: one per thread and store (see the module doc of `redis`), a slow
//! one for a verify's reads, the look at `maxmemory-policy` that refuses an evicting Redis,
//! and the calls themselves, bounded by the timeout and traced.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, Value};
use tracing::Instrument;

use super::call::bounded;
use super::info::eviction_policies;
use super::RedisCounterStore;
use crate::engine::store::StoreError;
use crate::logs::Throttle;

/// A connection made on first use, then cloned for each call.
pub(super) type Slot = Arc<tokio::sync::OnceCell<Connection>>;

thread_local! {
    /// This thread's connection to each live store, by the store's `id`, with the
    /// target's generation it was made in. A store that is dropped leaves a dead entry,
    /// removed when this thread next adds one.
    static SLOTS: RefCell<Vec<(Weak<()>, u64, Slot)>> = const { RefCell::new(Vec::new()) };
}

/// Set while the last look at Redis's `maxmemory-policy` found it unsafe: every script
/// call (consumes, give-backs) and readiness are refused. Plain commands (the drain, the
/// look itself) go on, so that waiting entries still reach SQL and a fixed setting is seen.
#[derive(Debug, Default)]
pub(super) struct Refusal {
    set: std::sync::atomic::AtomicBool,
    why: std::sync::Mutex<String>,
}

impl Refusal {
    /// The reason, while refused (one atomic load when not).
    pub(super) fn get(&self) -> Option<String> {
        if !self.set.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        Some(self.why.lock().map(|why| why.clone()).unwrap_or_default())
    }

    /// Refuses (with the reason) or serves, after a look at the policy.
    pub(super) fn judged(&self, verdict: &Result<(), StoreError>) {
        if let Err(StoreError::Misconfigured(why)) = verdict {
            if let Ok(mut kept) = self.why.lock() {
                kept.clone_from(why);
            }
        }
        let refused = matches!(verdict, Err(StoreError::Misconfigured(_)));
        self.set
            .store(refused, std::sync::atomic::Ordering::Release);
    }
}

/// The two kinds of Redis deployments, behind one handle.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server (or a proxy in front of several), with the `WAIT`s sent on it.
    Standalone(ConnectionManager, Arc<super::replicas::Waits>),
    /// Redis Cluster: commands are routed by the hash slot of their first key; the
    /// `WAIT`s sent for each shard.
    Cluster(ClusterConnection, Arc<super::replicas::ClusterWaits>),
}

impl RedisCounterStore {
    /// This thread's slot for its connection to this store: a new one when the target
    /// has moved on to another primary since the slot was made.
    pub(super) fn slot(&self) -> Slot {
        let generation = self.target.generation();
        SLOTS.with(|slots| {
            let mut slots = slots.borrow_mut();
            let id = Arc::as_ptr(&self.id);
            if let Some((_, made_in, slot)) =
                slots.iter_mut().find(|(owner, _, _)| owner.as_ptr() == id)
            {
                if *made_in != generation {
                    *made_in = generation;
                    *slot = Slot::default();
                }
                return slot.clone();
            }
            slots.retain(|(owner, _, _)| owner.strong_count() > 0);
            let slot = Slot::default();
            slots.push((Arc::downgrade(&self.id), generation, slot.clone()));
            slot
        })
    }

    /// A new connection whose replies may take up to `response` (connecting takes at most
    /// the call timeout).
    pub(super) async fn connect_with(
        &self,
        response: Duration,
    ) -> Result<Connection, redis::RedisError> {
        if self.cluster {
            let client = self.target.cluster_client(self.timeout, response)?;
            Ok(Connection::Cluster(
                client.get_async_connection().await?,
                Arc::default(),
            ))
        } else {
            let client = self.target.standalone_client().await?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(response));
            Ok(Connection::Standalone(
                ConnectionManager::new_with_config(client, config).await?,
                Arc::default(),
            ))
        }
    }

    /// The first connection, at start, given more time than a call (a TLS handshake to a
    /// distant managed Redis): a certificate that does not verify is an error, which
    /// stops the start; an unreachable Redis is only logged (the service starts not
    /// ready and connects when Redis answers).
    pub(super) async fn first_connection(&self) -> Result<(), StoreError> {
        let patience = self.timeout.max(FIRST_CONNECTION);
        // One attempt, not a connection manager's retries: a refused certificate is final.
        let probe = async {
            match self.cluster {
                true => {
                    let client = self.target.cluster_client(patience, patience)?;
                    client.get_async_connection().await.map(drop)
                }
                false => {
                    let client = self.target.standalone_client().await?;
                    client.get_multiplexed_async_connection().await.map(drop)
                }
            }
        };
        match tokio::time::timeout(patience, probe).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => match crate::tls::refusal(&error) {
                Some(why) => Err(StoreError::Misconfigured(format!(
                    "Redis (REDIS_URL): the TLS connection was refused: {why}"
                ))),
                None => {
                    tracing::warn!(error = %error, "Redis is not reachable yet; will retry on use");
                    Ok(())
                }
            },
            Err(_) => {
                tracing::warn!(
                    "Redis did not answer within {} ms; will retry on use",
                    patience.as_millis()
                );
                Ok(())
            }
        }
    }

    /// The connection of `counters verify`'s long reads: replies may take `response`.
    pub(super) async fn slow_connection(
        &self,
        response: Duration,
    ) -> Result<Connection, StoreError> {
        let connect = || async {
            bounded(response, self.connect_with(response))
                .await
                .map_err(|e| match e {
                    StoreError::Timeout(why) => {
                        StoreError::NotConnected(format!("connecting: {why}"))
                    }
                    other => other,
                })
        };
        let generation = self.target.generation();
        let slot = {
            let mut slow = self
                .slow
                .lock()
                .map_err(|_| StoreError::Unavailable("a poisoned lock".to_owned()))?;
            if slow.0 != generation {
                *slow = (generation, Slot::default());
            }
            slow.1.clone()
        };
        slot.get_or_try_init(connect).await.cloned()
    }

    /// This thread's connection, made now if it was not yet.
    pub(super) async fn connection(&self) -> Result<Connection, StoreError> {
        let connecting = self.connect_with(self.timeout);
        // Not connected within the deadline: unreachable (a closed port ends here too, as
        // the client retries within the deadline), or, while this instance sheds load,
        // most likely our own saturation (the handshake's reply waited here).
        let connect = || async {
            let mut connection = bounded(self.timeout, connecting)
                .await
                .map_err(|e| match e {
                    StoreError::Timeout(why) => {
                        StoreError::NotConnected(format!("connecting: {why}"))
                    }
                    other => other,
                })?;
            self.check_eviction(&mut connection).await?;
            Ok(connection)
        };
        self.slot().get_or_try_init(connect).await.cloned()
    }

    /// Refuses a Redis whose `maxmemory-policy` may evict keys, checked on every new
    /// connection: evicted counters over-allow, evicted idempotency records double-charge,
    /// evicted stream entries are lost charges, and nothing would say so. With
    /// `allow_eviction`, warns instead.
    pub(super) async fn check_eviction(
        &self,
        connection: &mut Connection,
    ) -> Result<(), StoreError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply: Result<Value, StoreError> = match connection {
            Connection::Standalone(c, _) => bounded(self.timeout, info.query_async(c)).await,
            Connection::Cluster(c, _) => bounded(self.timeout, info.query_async(c)).await,
        };
        let reply = match reply {
            Ok(reply) => reply,
            // A Redis that refuses INFO (an ACL) cannot be checked: say so, and serve.
            Err(StoreError::Protocol(why)) => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(count, error = %why, "cannot read Redis's maxmemory-policy; make sure it is noeviction");
                }
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let verdict = self.judge(&eviction_policies(&reply));
        self.refusal.judged(&verdict);
        verdict
    }

    /// Whether `policies` (every node's `maxmemory-policy`) may be served: an evicting one
    /// is refused (logged at error level) unless `allow_eviction` (a warning then).
    pub(super) fn judge(&self, policies: &[String]) -> Result<(), StoreError> {
        let Some(policy) = policies.iter().find(|policy| *policy != "noeviction") else {
            return Ok(());
        };
        let why = format!(
            "Redis maxmemory-policy is '{policy}': Redis may evict counters, idempotency \
             records, holds and ledger entries not yet moved to SQL, which over-allows quota \
             and loses charges without an error. Set maxmemory-policy to noeviction (CONFIG \
             SET maxmemory-policy noeviction, and in redis.conf), or set \
             QUOTA_REDIS_ALLOW_EVICTION=true to accept that risk"
        );
        if self.allow_eviction {
            static SITE: Throttle = Throttle::new();
            if let Some(count) = SITE.event() {
                tracing::warn!(
                    count,
                    "{why}; serving anyway (QUOTA_REDIS_ALLOW_EVICTION=true)"
                );
            }
            return Ok(());
        }
        static SITE: Throttle = Throttle::new();
        if let Some(count) = SITE.event() {
            tracing::error!(count, "{why}; refusing every call");
        }
        Err(StoreError::Misconfigured(why))
    }

    /// One script call, as a `redis` child span of the request when traces are exported.
    pub(super) async fn exec(&self, script: &Script, call: &Cmd) -> Result<Value, StoreError> {
        self.exec_script(script, call)
            .instrument(redis_span("redis EVALSHA"))
            .await
    }

    /// Runs `call` of `script` under the circuit breaker and the timeout.
    pub(super) async fn exec_script(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> Result<Value, StoreError> {
        self.exec_on(script, call).await.map(|(reply, _)| reply)
    }

    /// [`Self::exec_script`], with the connection the call ran on (a `WAIT` after it
    /// must go there).
    pub(super) async fn exec_on(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> Result<(Value, Connection), StoreError> {
        if let Some(why) = self.refusal.get() {
            return Err(StoreError::Misconfigured(why));
        }
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable(
                "Redis failed repeatedly; circuit open, retrying shortly".to_owned(),
            ));
        }
        let reply = async {
            // Callers queued behind another's connection attempt wait at most one deadline.
            let connection = tokio::time::timeout(self.timeout, self.connection())
                .await
                .map_err(|_| {
                    StoreError::NotConnected(format!(
                        "no connection within {} ms",
                        self.timeout.as_millis()
                    ))
                })??;
            let mut connection = connection;
            let reply = match &mut connection {
                Connection::Standalone(c, _) => bounded(self.timeout, run(script, c, call)).await,
                Connection::Cluster(c, _) => bounded(self.timeout, run(script, c, call)).await,
            };
            reply.map(|reply| (reply, connection))
        }
        .await;
        match &reply {
            // While this instance sheds load and Redis still answers, a late reply most
            // likely waited behind the flood here, not in Redis: neither a failure of
            // Redis nor a success.
            Err(error) if error.is_late() && self.load.as_ref().is_some_and(|l| l.saturated()) => {}
            Err(error) if error.is_transient() => {
                // A replica's READONLY, or a primary gone: with Sentinel, ask again now.
                self.target.suspect_primary();
                self.breaker.failed();
            }
            Ok(_) => {
                if let Some(load) = &self.load {
                    load.answered();
                }
                self.breaker.succeeded();
            }
            Err(_) => self.breaker.succeeded(),
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
    pub(super) async fn plain<T: redis::FromRedisValue>(
        &self,
        call: &Cmd,
    ) -> Result<T, StoreError> {
        let connection = self.connection().await?;
        self.plain_on(&connection, call).await
    }

    /// [`Self::plain`] on `connection` (a `WAIT` after it must go there too).
    pub(super) async fn plain_on<T: redis::FromRedisValue>(
        &self,
        connection: &Connection,
        call: &Cmd,
    ) -> Result<T, StoreError> {
        async {
            match connection.clone() {
                Connection::Standalone(mut c, _) => {
                    bounded(self.timeout, call.query_async(&mut c)).await
                }
                Connection::Cluster(mut c, _) => {
                    bounded(self.timeout, call.query_async(&mut c)).await
                }
            }
        }
        .instrument(redis_span("redis command"))
        .await
    }
}

/// The most the first connection may take at start.
const FIRST_CONNECTION: Duration = Duration::from_secs(5);

/// The span of one Redis call named `name`: a client child span of the request when spans
/// are exported and the caller runs inside one; none for background work (the drain, the
/// sweeper, rebuilds), which makes no span per call.
pub(super) fn redis_span(name: &'static str) -> tracing::Span {
    if !crate::logs::spans_exported() || tracing::Span::current().is_none() {
        return tracing::Span::none();
    }
    tracing::trace_span!(
        "redis",
        otel.name = name,
        otel.kind = "client",
        db.system = "redis",
    )
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
