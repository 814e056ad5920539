//! Moves ledger entries from the Redis streams into the SQL ledger.
//!
//! Every instance runs one drain, a consumer (named at random per process) of the group
//! `ledger` on each shard's stream. A pass reads a batch, inserts it in one transaction
//! (`ON CONFLICT DO NOTHING` on the entry id), and only then acknowledges and deletes it.
//! A crash between insert and acknowledgement redelivers entries that are already in SQL,
//! which the insert ignores; entries a dead instance had read but not acknowledged are
//! claimed by a living one once idle for `claim_idle`. Nothing is lost, nothing duplicated.

use super::{LedgerEntry, LedgerStore};
use crate::engine::keys::{ledger_stream, SHARDS};
use crate::engine::store::redis::RedisCounterStore;
use crate::engine::store::redis_stream::{Read, StreamEntry};
use crate::engine::DrainNow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries read per command.
const BATCH: usize = 500;

/// The drain of one instance.
pub struct Drainer {
    redis: Arc<RedisCounterStore>,
    ledger: Arc<dyn LedgerStore>,
    prefix: String,
    consumer: String,
    claim_idle: Duration,
    /// Set when an insert failed: the next pass rereads this consumer's pending entries.
    retry_pending: AtomicBool,
    /// One pass at a time (the background loop and refunds may both ask).
    pass: tokio::sync::Mutex<Instant>,
}

impl Drainer {
    /// A drain over `redis`'s streams into `ledger`.
    pub fn new(
        redis: Arc<RedisCounterStore>,
        ledger: Arc<dyn LedgerStore>,
        prefix: String,
        claim_idle: Duration,
    ) -> Self {
        Self {
            redis,
            ledger,
            prefix,
            consumer: format!("drain-{}", uuid::Uuid::new_v4().simple()),
            claim_idle,
            // A new consumer has nothing pending, but reading once is cheap and simple.
            retry_pending: AtomicBool::new(true),
            pass: tokio::sync::Mutex::new(Instant::now()),
        }
    }

    /// One pass over every shard; returns how many entries were moved.
    pub async fn drain_once(&self) -> usize {
        let mut last_claim = self.pass.lock().await;
        let claim = last_claim.elapsed() >= self.claim_idle / 2;
        if claim {
            *last_claim = Instant::now();
        }
        let pending = self.retry_pending.swap(false, Ordering::AcqRel);
        let mut moved = 0;
        for shard in 0..SHARDS {
            let stream = ledger_stream(&self.prefix, shard);
            let mut sources = Vec::with_capacity(3);
            if pending {
                sources.push(Some(Read::Pending));
            }
            sources.push(Some(Read::New));
            if claim {
                sources.push(None);
            }
            for source in sources {
                match self.move_all(&stream, source).await {
                    Ok(n) => moved += n,
                    Err(error) => {
                        tracing::warn!(error = %error, stream, "draining the ledger stream failed; will retry");
                        self.retry_pending.store(true, Ordering::Release);
                        return moved;
                    }
                }
            }
        }
        moved
    }

    /// Moves batches from one source until it is empty.
    async fn move_all(&self, stream: &str, source: Option<Read>) -> anyhow::Result<usize> {
        let mut moved = 0;
        loop {
            let batch: Vec<StreamEntry> = match source {
                Some(read) => {
                    self.redis
                        .read_group(stream, &self.consumer, BATCH, read)
                        .await?
                }
                None => {
                    let idle = u64::try_from(self.claim_idle.as_millis()).unwrap_or(u64::MAX);
                    self.redis
                        .claim_idle(stream, &self.consumer, idle, BATCH)
                        .await?
                }
            };
            if batch.is_empty() {
                return Ok(moved);
            }
            let mut entries = Vec::with_capacity(batch.len());
            for (id, text) in &batch {
                match serde_json::from_str::<LedgerEntry>(text) {
                    Ok(entry) => entries.push(entry),
                    // Written by our own script from our own JSON: a bug. Keep it in Redis,
                    // pending, for an operator, rather than losing it.
                    Err(error) => {
                        tracing::error!(error = %error, stream, id, "unreadable ledger entry left pending");
                    }
                }
            }
            self.ledger.append(&entries).await?;
            let readable: Vec<String> = batch
                .iter()
                .filter(|(_, text)| serde_json::from_str::<LedgerEntry>(text).is_ok())
                .map(|(id, _)| id.clone())
                .collect();
            self.redis.ack(stream, &readable).await?;
            moved += readable.len();
            if batch.len() < BATCH || source == Some(Read::Pending) {
                return Ok(moved);
            }
        }
    }

    /// Runs passes forever: back to back while there is work, every 200 ms otherwise.
    pub fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                if self.drain_once().await == 0 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        })
    }
}

#[async_trait::async_trait]
impl DrainNow for Drainer {
    async fn drain_now(&self) {
        self.drain_once().await;
    }

    async fn backlog(&self) -> Option<u64> {
        let mut total = 0;
        for shard in 0..SHARDS {
            total += self
                .redis
                .stream_len(&ledger_stream(&self.prefix, shard))
                .await
                .ok()?;
        }
        Some(total)
    }
}
