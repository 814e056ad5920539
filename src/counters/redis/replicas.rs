//! Replicated answers (`QUOTA_REDIS_MIN_REPLICAS`): a decision that charged is answered only
//! once that many replicas acknowledged it. `WAIT` cannot run inside a script, so it follows
//! the script on the same connection, and one `WAIT` answers every call that finished on
//! that connection before it was sent: while one is in flight, the calls that finish
//! meanwhile wait for the next, together.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::oneshot;

use super::call::bounded;
use super::connection::Connection;
use super::RedisCounterStore;
use crate::engine::store::StoreError;

/// The `WAIT`s of one connection.
#[derive(Debug, Default)]
pub(super) struct Waits {
    state: Mutex<WaitState>,
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
        connection: ConnectionManager,
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
    async fn send(
        self: Arc<Self>,
        mut connection: ConnectionManager,
        replicas: u32,
        wait: Duration,
    ) {
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
            let mut command = redis::cmd("WAIT");
            command.arg(replicas).arg(wait_ms);
            let reply: Result<i64, StoreError> =
                bounded(wait * 2, command.query_async(&mut connection)).await;
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
    /// on) wrote: [`StoreError::Unreplicated`] when fewer than the required did in time.
    pub(super) async fn replicated(&self, connection: Connection) -> Result<(), StoreError> {
        let Connection::Standalone(manager, waits) = connection else {
            return Err(StoreError::Protocol(
                "QUOTA_REDIS_MIN_REPLICAS is not supported on a Redis Cluster".to_owned(),
            ));
        };
        // Half the call's deadline for WAIT itself, so that its reply arrives within the
        // connection's response timeout.
        let wait = self.timeout / 2;
        let acked = waits.acked(manager, self.min_replicas, wait).await?;
        if acked < i64::from(self.min_replicas) {
            return Err(StoreError::Unreplicated(format!(
                "{acked} of the {} replicas required (QUOTA_REDIS_MIN_REPLICAS) acknowledged \
                 the change within {} ms",
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
    pub(super) async fn entries_replicated(&self) -> Result<(), StoreError> {
        if self.min_replicas == 0 {
            return Ok(());
        }
        let mut fence = redis::cmd("INCR");
        fence.arg(crate::keys::replication_fence(&self.prefix));
        let _: i64 = self.plain(&fence).await?;
        self.replicated(self.connection().await?).await
    }

    /// Whether Redis has the replicas `QUOTA_REDIS_MIN_REPLICAS` requires connected
    /// (`INFO replication`); an error naming both numbers when it has fewer.
    pub(super) async fn enough_replicas(&self) -> Result<(), StoreError> {
        if self.min_replicas == 0 {
            return Ok(());
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let text: String = self.plain(&info).await?;
        let connected = text
            .lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count();
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
