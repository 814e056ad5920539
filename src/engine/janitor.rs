//! The janitor: the one instance at a time that does the background work nobody asked for.
//!
//! Each instance drains the ledger streams it appended to and releases the holds it opened
//! when they fall due (see [`drain`](crate::engine::pipeline::drain) and [`HoldDues`](crate::engine::decision::giveback::HoldDues)).
//! What is left is what a dead instance left behind, and it is the janitor's: entries it
//! appended and never read, entries it read and never acknowledged (claimed once idle for
//! the claim timeout), holds it opened, shards whose Redis data was lost while no request
//! came, and (Redis Cluster) consumes across slots it left unfinished.
//!
//! The janitor holds a lease in the counter store, taken with `SET NX` semantics and
//! extended every third of its time to live; an instance that dies stops extending it,
//! and another takes it within [`Janitor::ttl`] (at most the claim timeout). Two
//! janitors at once, for a moment, are harmless: every sweep it makes is safe to repeat.
//! Its Redis work is therefore the same whatever the number of instances.

use crate::engine::store::CounterStore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest the lease lives without being extended.
const MAX_TTL: Duration = Duration::from_secs(10);

/// The shortest (test settings claim after half a second).
const MIN_TTL: Duration = Duration::from_secs(1);

/// Whether this instance is the janitor, and the lease that makes it so.
pub struct Janitor {
    store: Arc<dyn CounterStore>,
    key: String,
    owner: String,
    ttl: Duration,
    held: AtomicBool,
}

impl Janitor {
    /// The janitor lease of the instances sharing `store` under `prefix`, with a time to
    /// live of the claim timeout `claim_idle`, within 1 to 10 s.
    pub fn new(store: Arc<dyn CounterStore>, prefix: &str, claim_idle: Duration) -> Self {
        Self {
            store,
            key: crate::keys::janitor_lease(prefix),
            owner: uuid::Uuid::new_v4().simple().to_string(),
            ttl: lease_ttl(claim_idle),
            held: AtomicBool::new(false),
        }
    }

    /// Whether this instance held the lease at its last extension.
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// How long the lease lives without being extended: another instance takes it at
    /// most this long after its holder died.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often [`Janitor::keep`] is to be called.
    pub fn keep_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Takes the lease if it is free, or extends it if it is ours; returns whether this
    /// instance is the janitor now. A store that does not answer loses it (another
    /// instance, which reaches the store, may take it).
    pub async fn keep(&self) -> bool {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let held = match self.store.lease(&self.key, &self.owner, ttl_ms).await {
            Ok(held) => held,
            Err(error) => {
                tracing::debug!(error = %error, "extending the janitor lease failed");
                false
            }
        };
        if self.held.swap(held, Ordering::AcqRel) != held {
            match held {
                true => tracing::info!("this instance is the janitor now"),
                false => tracing::info!("this instance is no longer the janitor"),
            }
        }
        held
    }

    /// Gives the lease up (a graceful stop), so that another instance takes it at once.
    pub async fn give_up(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            if let Err(error) = self.store.release(&self.key, &self.owner).await {
                tracing::debug!(error = %error, "giving the janitor lease up failed; it expires");
            }
        }
    }

    /// Keeps the lease every [`Janitor::keep_every`], until aborted.
    pub(crate) fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                self.keep().await;
                tokio::time::sleep(self.keep_every()).await;
            }
        })
    }
}

/// The lease's time to live for the claim timeout `claim_idle`: the same, within 1 to 10 s.
fn lease_ttl(claim_idle: Duration) -> Duration {
    claim_idle.clamp(MIN_TTL, MAX_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_lives_for_the_claim_timeout_within_one_to_ten_seconds() {
        let of = |ms| lease_ttl(Duration::from_millis(ms));
        assert_eq!(of(500), Duration::from_secs(1));
        assert_eq!(of(4_000), Duration::from_secs(4));
        assert_eq!(of(30_000), Duration::from_secs(10));
    }
}
