//! Replicated answers (`QUOTA_REDIS_MIN_REPLICAS`): a decision that charged is answered only
//! once that many replicas acknowledged it. `WAIT` cannot run inside a script, so it follows
//! the script on the same connection, and one `WAIT` answers every call that finished on
//! that connection before it was sent: while one is in flight, the calls that finish
//! meanwhile wait for the next, together.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::Value;
use tokio::sync::oneshot;

use super::call::bounded;
use super::connection::Connection;
use super::RedisCounterStore;
use crate::engine::store::StoreError;

/// The `WAIT`s of one connection (on a cluster: of one connection to one shard's node).
#[derive(Debug, Default)]
pub(super) struct Waits {
    state: Mutex<WaitState>,
}

/// Where a `WAIT` goes: the connection the calls ran on, or on a cluster the primary of
/// their slot (the cluster client would otherwise send it to every primary).
#[derive(Clone)]
enum WaitOn {
    Standalone(ConnectionManager),
    Node(ClusterConnection, Route),
}

impl WaitOn {
    /// `WAIT replicas wait_ms` there: how many replicas acknowledged.
    async fn wait(&mut self, replicas: u32, wait_ms: u64) -> redis::RedisResult<i64> {
        let mut command = redis::cmd("WAIT");
        command.arg(replicas).arg(wait_ms);
        match self {
            Self::Standalone(connection) => command.query_async(connection).await,
            Self::Node(connection, route) => {
                let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(*route));
                match connection.route_command(command, node).await? {
                    Value::Int(acked) => Ok(acked),
                    other => Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "WAIT answered",
                        format!("{other:?}"),
                    ))),
                }
            }
        }
    }
}

/// The `WAIT`s of one cluster connection, one [`Waits`] per shard: calls of one shard
/// wait together, on their slot's primary.
#[derive(Debug)]
pub(super) struct ClusterWaits(Vec<Arc<Waits>>);

impl Default for ClusterWaits {
    fn default() -> Self {
        Self((0..crate::keys::SHARDS).map(|_| Arc::default()).collect())
    }
}

/// The calls waiting for the next `WAIT`, and whether a task sends them.
#[derive(Debug, Default)]
struct WaitState {
    /// Each waiting call's answer: the replicas that acknowledged, or why none could say.
    pending: Vec<oneshot::Sender<Result<i64, StoreError>>>,
    /// Whether a task is sending `WAIT`s for this connection.
    running: bool,
}

impl Waits {
    /// How many replicas acknowledged every write this connection sent before now (at
    /// most `replicas` are waited for, for at most `wait`).
    async fn acked(
        self: &Arc<Self>,
        connection: WaitOn,
        replicas: u32,
        wait: Duration,
    ) -> Result<i64, StoreError> {
        let (answer, answered) = oneshot::channel();
        let lead = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.pending.push(answer);
            !std::mem::replace(&mut state.running, true)
        };
        if lead {
            tokio::spawn(self.clone().send(connection, replicas, wait));
        }
        answered.await.map_err(|_| {
            StoreError::Unavailable("the replicas' acknowledgement was lost".to_owned())
        })?
    }

    /// Sends one `WAIT` for all the calls waiting, then again for those that came meanwhile,
    /// until none waits.
    async fn send(self: Arc<Self>, mut connection: WaitOn, replicas: u32, wait: Duration) {
        // WAIT answers within its own timeout; the reply gets as long again to arrive.
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        loop {
            let waiting = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if state.pending.is_empty() {
                    state.running = false;
                    return;
                }
                std::mem::take(&mut state.pending)
            };
            let reply: Result<i64, StoreError> =
                bounded(wait * 2, connection.wait(replicas, wait_ms)).await;
            for answer in waiting {
                let _ = answer.send(match &reply {
                    Ok(acked) => Ok(*acked),
                    Err(error) => Err(StoreError::Unavailable(error.to_string())),
                });
            }
        }
    }
}

impl RedisCounterStore {
    /// The store, answering a decision that charged only once `replicas` replicas
    /// acknowledged it (0: at once).
    pub fn requiring_replicas(mut self, replicas: u32) -> Self {
        self.min_replicas = replicas;
        self
    }

    /// Waits until the replicas acknowledged what `connection` (the one the decision ran
    /// on) wrote, to `key` (on a cluster, the `WAIT` goes to the primary of its slot):
    /// [`StoreError::Unreplicated`] when fewer than the required did in time, its text
    /// ending with `then` (what becomes of the change).
    pub(super) async fn replicated(
        &self,
        connection: Connection,
        key: &str,
        then: &str,
    ) -> Result<(), StoreError> {
        let (on, waits) = match connection {
            Connection::Standalone(manager, waits) => (WaitOn::Standalone(manager), waits),
            Connection::Cluster(cluster, waits) => {
                let shard = usize::from(crate::keys::shard_of(key).unwrap_or(0));
                let waits = waits.0[shard % waits.0.len()].clone();
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                (WaitOn::Node(cluster, route), waits)
            }
        };
        // Half the call's deadline for WAIT itself, so that its reply arrives within the
        // connection's response timeout.
        let wait = self.timeout / 2;
        let acked = waits.acked(on, self.min_replicas, wait).await?;
        if acked < i64::from(self.min_replicas) {
            return Err(StoreError::Unreplicated(format!(
                "{acked} of the {} replicas required (QUOTA_REDIS_MIN_REPLICAS) acknowledged \
                 the change within {} ms; {then}",
                self.min_replicas,
                wait.as_millis()
            )));
        }
        Ok(())
    }

    /// Waits until the replicas hold every entry the drain has read so far, before the drain
    /// commits them to SQL: the ledger never holds a charge that a promoted replica lacks.
    /// A write of the drain's own (`WAIT` covers what its connection wrote, and a read may
    /// have written nothing) brings its connection's offset up to everything before it.
    /// On a cluster, the write and the `WAIT` go to the node of `stream`'s slot.
    pub(super) async fn entries_replicated(&self, stream: &str) -> Result<(), StoreError> {
        if self.min_replicas == 0 {
            return Ok(());
        }
        let fence = match self.cluster {
            true => crate::keys::replication_fence_of(&self.prefix, stream),
            false => crate::keys::replication_fence(&self.prefix),
        };
        let mut incr = redis::cmd("INCR");
        incr.arg(&fence);
        // One connection for both: WAIT covers what its own connection wrote (the task
        // may resume on another thread, with another thread's connection, between them).
        let connection = self.connection().await?;
        let _: i64 = self.plain_on(&connection, &incr).await?;
        self.replicated(connection, &fence, "the drain retries")
            .await
    }

    /// Whether Redis has the replicas `QUOTA_REDIS_MIN_REPLICAS` requires connected
    /// (`INFO replication`); an error naming both numbers when it has fewer.
    pub(super) async fn enough_replicas(&self) -> Result<(), StoreError> {
        if self.min_replicas == 0 {
            return Ok(());
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        // On a cluster INFO goes to every primary: the one with the fewest counts.
        let reply: Value = self.plain(&info).await?;
        let connected = super::info::fewest_online_replicas(&reply);
        match connected >= self.min_replicas as usize {
            true => Ok(()),
            false => Err(StoreError::Misconfigured(format!(
                "QUOTA_REDIS_MIN_REPLICAS is {} but Redis has {connected} replicas online: \
                 every charge would be answered 503",
                self.min_replicas
            ))),
        }
    }
}
