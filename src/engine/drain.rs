//! Moves ledger entries from the Redis streams into the SQL ledger.
//!
//! Every instance runs one drain, a consumer (named at random per process) of the group
//! `ledger` on each shard's stream. A pass reads a batch, inserts it in one transaction
//! (`ON CONFLICT DO NOTHING` on the entry id), and only then acknowledges and deletes it.
//! A crash between insert and acknowledgement redelivers entries that are already in SQL,
//! which the insert ignores; entries a dead instance had read but not acknowledged are
//! claimed by a living one once idle for `claim_idle`. Nothing is lost, nothing duplicated.

use super::codec;
use super::lag::Lag;
use super::ledger::{LedgerError, LedgerStore};
use super::store::StoreError;
use super::stream::{LedgerStream, Read, StreamEntry};
use crate::domain::LedgerEntry;
use crate::keys::{ledger_stream, SHARDS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries read per command.
const BATCH: usize = 500;

/// Entries per SQL transaction, at most (a pass commits whenever it has gathered this many).
const FLUSH_AT: usize = 5_000;

/// The wait after a pass that moved something but filled no transaction.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// The wait after a pass that found nothing.
const IDLE_PAUSE: Duration = Duration::from_millis(200);

/// The drain of one instance.
pub struct Drainer {
    streams: Arc<dyn LedgerStream>,
    ledger: Arc<dyn LedgerStore>,
    prefix: String,
    consumer: String,
    claim_idle: Duration,
    /// Set when an insert failed: the next pass rereads this consumer's pending entries.
    retry_pending: AtomicBool,
    /// One pass at a time (the background loop and refunds may both ask).
    pass: tokio::sync::Mutex<Instant>,
    /// Each moved entry's lag, decision to SQL commit.
    lag: Arc<Lag>,
}

impl Drainer {
    /// A drain over the ledger `streams` into `ledger`.
    pub fn new(
        streams: Arc<dyn LedgerStream>,
        ledger: Arc<dyn LedgerStore>,
        prefix: String,
        claim_idle: Duration,
    ) -> Self {
        Self {
            streams,
            ledger,
            prefix,
            consumer: format!("drain-{}", uuid::Uuid::new_v4().simple()),
            claim_idle,
            // A new consumer has nothing pending, but reading once is cheap and simple.
            retry_pending: AtomicBool::new(true),
            pass: tokio::sync::Mutex::new(Instant::now()),
            lag: Arc::default(),
        }
    }

    /// Records each moved entry's lag (decision to SQL commit) in `lag`.
    #[must_use]
    pub fn recording_lag(mut self, lag: Arc<Lag>) -> Self {
        self.lag = lag;
        self
    }

    /// One pass over every shard, until each is empty; returns how many entries were moved.
    ///
    /// Entries from all shards share transactions of up to [`FLUSH_AT`] entries: one
    /// commit (and one fsync) per few thousand entries rather than per shard and batch.
    pub async fn drain_once(&self) -> usize {
        let mut last_claim = self.pass.lock().await;
        let claim = last_claim.elapsed() >= self.claim_idle / 2;
        if claim {
            *last_claim = Instant::now();
        }
        let pending = self.retry_pending.swap(false, Ordering::AcqRel);
        let mut sources = Vec::with_capacity(3);
        if pending {
            sources.push(Source::Pending);
        }
        sources.push(Source::New);
        if claim {
            sources.push(Source::Idle);
        }
        let mut pass = Pass::default();
        match self.run_pass(&sources, &mut pass).await {
            Ok(()) => pass.moved,
            Err(error) => {
                tracing::warn!(error = %error, "draining the ledger streams failed; will retry");
                self.retry_pending.store(true, Ordering::Release);
                pass.moved
            }
        }
    }

    async fn run_pass(&self, sources: &[Source], pass: &mut Pass) -> anyhow::Result<()> {
        for shard in 0..SHARDS {
            let stream = ledger_stream(&self.prefix, shard);
            for &source in sources {
                // Pending entries stay pending until flushed: page through them by id.
                let mut after = String::from("0");
                loop {
                    let batch = self.read(&stream, source, &after).await?;
                    let more = batch.len() == BATCH;
                    if let Some((last, _)) = batch.last() {
                        after.clone_from(last);
                    }
                    pass.add(&stream, batch);
                    if pass.entries.len() >= FLUSH_AT {
                        self.flush(pass).await?;
                    }
                    if !more {
                        break;
                    }
                }
            }
        }
        self.flush(pass).await
    }

    /// Up to [`BATCH`] entries of `stream` from `source`; pending ones with ids after
    /// `after`.
    async fn read(
        &self,
        stream: &str,
        source: Source,
        after: &str,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let consumer = &self.consumer;
        match source {
            Source::Pending => {
                let read = Read::PendingAfter(after);
                self.streams.read_group(stream, consumer, BATCH, read).await
            }
            Source::New => {
                self.streams
                    .read_group(stream, consumer, BATCH, Read::New)
                    .await
            }
            Source::Idle => {
                let idle = u64::try_from(self.claim_idle.as_millis()).unwrap_or(u64::MAX);
                self.streams.claim_idle(stream, consumer, idle, BATCH).await
            }
        }
    }

    /// Inserts what `pass` holds in one transaction, then acknowledges and deletes it.
    async fn flush(&self, pass: &mut Pass) -> anyhow::Result<()> {
        if pass.entries.is_empty() {
            return Ok(());
        }
        let refused = match self.ledger.append(&pass.entries).await {
            Ok(_) => {
                let committed = chrono::Utc::now();
                self.lag
                    .observe_all(committed, pass.entries.iter().map(|e| e.at));
                Vec::new()
            }
            // One entry breaking a constraint must not hold back the others.
            Err(LedgerError::Corrupt(why)) => self.insert_in_parts(&pass.entries, &why).await?,
            Err(error) => return Err(error.into()),
        };
        pass.entries.clear();
        let mut acks: Vec<Vec<String>> = vec![Vec::new(); pass.streams.len()];
        for (i, (stream, id)) in pass.origins.drain(..).enumerate() {
            if !refused.contains(&i) {
                acks[stream].push(id);
            }
        }
        for (stream, ids) in pass.streams.drain(..).zip(acks) {
            self.streams.ack(&stream, &ids).await?;
            pass.moved += ids.len();
        }
        Ok(())
    }

    /// After a refused batch: inserts it in halves, and halves of halves, down to the
    /// entries refused on their own (ids make a repeat harmless), and returns their
    /// positions. A few bad entries cost a few transactions each, not one per entry. The
    /// refused ones stay pending in Redis, for an operator, rather than being lost.
    async fn insert_in_parts(
        &self,
        entries: &[LedgerEntry],
        why: &str,
    ) -> Result<Vec<usize>, LedgerError> {
        tracing::warn!(error = %why, entries = entries.len(), "a ledger batch was refused; inserting it in parts");
        let mut refused = Vec::new();
        let half = entries.len() / 2;
        let mut parts = vec![(half, entries.len()), (0, half)];
        while let Some((start, end)) = parts.pop() {
            if start == end {
                continue;
            }
            match self.ledger.append(&entries[start..end]).await {
                Ok(_) => {}
                Err(LedgerError::Corrupt(why)) if end - start == 1 => {
                    tracing::error!(error = %why, id = %entries[start].id, "the SQL ledger refused an entry; it is left pending in Redis");
                    refused.push(start);
                }
                Err(LedgerError::Corrupt(_)) => {
                    let mid = start + (end - start) / 2;
                    parts.push((mid, end));
                    parts.push((start, mid));
                }
                Err(error) => return Err(error),
            }
        }
        Ok(refused)
    }

    /// Runs passes forever. After a pass that filled a transaction the next starts at
    /// once; otherwise it waits a little, so that entries gather into larger transactions
    /// (a refund that needs its charge in SQL drains at once, through [`Drainer::drain_once`]).
    pub(crate) fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let pause = match self.drain_once().await {
                    0 => IDLE_PAUSE,
                    n if n < FLUSH_AT => BUSY_PAUSE,
                    _ => Duration::ZERO,
                };
                tokio::time::sleep(pause).await;
            }
        })
    }
}

/// Where a pass reads a stream's entries from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This consumer's entries left unacknowledged by a failed pass.
    Pending,
    /// Entries never delivered.
    New,
    /// Entries another (dead) consumer left idle for `claim_idle`.
    Idle,
}

/// What a pass has read and not yet moved.
#[derive(Default)]
struct Pass {
    entries: Vec<LedgerEntry>,
    /// For each of `entries`, its stream (an index into `streams`) and its id there.
    origins: Vec<(usize, String)>,
    streams: Vec<String>,
    moved: usize,
}

impl Pass {
    fn add(&mut self, stream: &str, batch: Vec<StreamEntry>) {
        if self.streams.last().map(String::as_str) != Some(stream) {
            self.streams.push(stream.to_owned());
        }
        let at = self.streams.len() - 1;
        for (id, text) in batch {
            match codec::decode_entry(&text) {
                Ok(entry) => {
                    self.entries.push(entry);
                    self.origins.push((at, id));
                }
                // Written by our own script from our own JSON: a bug. Keep it in Redis,
                // pending, for an operator, rather than losing it.
                Err(error) => {
                    tracing::error!(error = %error, stream, id, "unreadable ledger entry left pending");
                }
            }
        }
    }
}

/// A stream id, `<ms>-<seq>`, as numbers (in the order Redis gives ids).
fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl Drainer {
    /// How many entries wait in the streams; `None` if the stream store did not answer.
    pub async fn backlog(&self) -> Option<u64> {
        self.waiting_in(0..SHARDS).await
    }

    /// The newest entry of each stream of `shards` now (shards whose stream is empty are
    /// left out): what [`Drainer::drained_to`] waits for. `None` if the store did not answer.
    pub(crate) async fn marks(
        &self,
        shards: impl IntoIterator<Item = u16>,
    ) -> Option<Vec<(u16, String)>> {
        let mut marks = Vec::new();
        for shard in shards {
            let last = self
                .streams
                .last_id(&ledger_stream(&self.prefix, shard))
                .await
                .ok()?;
            marks.extend(last.map(|id| (shard, id)));
        }
        Some(marks)
    }

    /// Whether every entry up to each mark has left its stream (it is in SQL: moved entries
    /// are deleted), whatever was appended after the marks.
    pub(crate) async fn drained_to(&self, marks: &[(u16, String)]) -> Option<bool> {
        for (shard, mark) in marks {
            let first = self
                .streams
                .first_id(&ledger_stream(&self.prefix, *shard))
                .await
                .ok()?;
            if first.is_some_and(|first| stream_id(&first) <= stream_id(mark)) {
                return Some(false);
            }
        }
        Some(true)
    }

    /// How many entries wait in the streams of `shards` (read by no drain yet, or read and
    /// not yet in SQL); `None` if the stream store did not answer.
    pub(crate) async fn waiting_in(&self, shards: impl IntoIterator<Item = u16>) -> Option<u64> {
        let mut total = 0;
        for shard in shards {
            total += self
                .streams
                .stream_len(&ledger_stream(&self.prefix, shard))
                .await
                .ok()?;
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::stream_id;

    #[test]
    fn stream_ids_order_by_time_then_sequence_as_numbers() {
        assert!(stream_id("1700000000000-9") < stream_id("1700000000001-0"));
        assert!(stream_id("5-10") > stream_id("5-9"), "numbers, not text");
        assert!(stream_id("10-0") > stream_id("9-99"));
        assert_eq!(stream_id("5-0"), (5, 0));
    }
}
