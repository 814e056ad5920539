//! Moves ledger entries from the Redis streams into the SQL ledger.
//!
//! Every instance runs one drain, a consumer (named at random per process) of the group
//! `ledger` on each shard's stream. A pass reads a batch, inserts it in one transaction
//! (`ON CONFLICT DO NOTHING` on the entry id), and only then acknowledges and deletes it.
//! A crash between insert and acknowledgement redelivers entries that are already in SQL,
//! which the insert ignores; entries a dead instance had read but not acknowledged are
//! claimed by a living one once idle for `claim_idle`. Nothing is lost, nothing duplicated.
//!
//! An instance does not poll: its counter store tells it which shards' streams it
//! appended to ([`Appends`]), and its drain wakes for those. What a dead instance left in
//! the streams is the [janitor](crate::engine::janitor)'s: every half claim timeout it measures
//! each stream and drains (and claims from) those that hold anything. With no traffic,
//! the drains of every instance together cost Redis 64 `XLEN` per half claim timeout.

use crate::domain::LedgerEntry;
use crate::engine::janitor::Janitor;
use crate::engine::ledger::{LedgerError, LedgerStore};
use crate::engine::pipeline::lag::Lag;
use crate::engine::pipeline::stream::{LedgerStream, Read, StreamEntry};
use crate::engine::store::StoreError;
use crate::keys::{ledger_stream, SHARDS};
use crate::logs::Throttle;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod floors;
mod moves;
mod pass;
use pass::{shards_charged, Cursor, Pass, Source};

/// The shards whose streams this instance appended to since its drain last looked, and
/// the wake-up of the drain. The counter store reports every call that may have appended
/// (after the call, so that the entry is there when the drain reads).
#[derive(Debug, Default)]
pub struct Appends {
    /// One bit per shard.
    shards: AtomicU64,
    wake: tokio::sync::Notify,
}

// One bit per shard in a u64.
const _: () = assert!(SHARDS <= 64);

/// Every shard.
const ALL: u64 = u64::MAX >> (64 - SHARDS);

/// The even shards.
const EVEN: u64 = 0x5555_5555_5555_5555 & ALL;

impl Appends {
    /// A call to the store may have appended to `shard`'s stream.
    pub fn appended(&self, shard: u16) {
        let bit = 1u64 << (shard % SHARDS);
        // Already set: a wake-up was given since the drain last took the set.
        if self.shards.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.wake.notify_one();
        }
    }

    /// The shards appended to since the last call.
    fn take(&self) -> u64 {
        self.shards.swap(0, Ordering::AcqRel)
    }
}
/// Entries read per command.
const BATCH: usize = 500;

/// Entries per SQL transaction, at most (a pass commits whenever it has gathered this many).
const FLUSH_AT: usize = 5_000;

/// The wait after a pass that moved something but filled no transaction.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// The wait after a pass that found nothing.
const IDLE_PAUSE: Duration = Duration::from_millis(200);

/// How often the drain reads the floors of the shards' write generations every instance's
/// drain recorded, for this instance's scripts to check (`LedgerStream::raise_floors`).
pub(crate) const FLOORS_EVERY: Duration = Duration::from_secs(1);

/// The drain of one instance.
pub struct Drainer {
    streams: Arc<dyn LedgerStream>,
    ledger: Arc<dyn LedgerStore>,
    prefix: String,
    consumer: String,
    claim_idle: Duration,
    /// The shards of a failed pass: the next pass rereads this consumer's pending entries
    /// there.
    retry: AtomicU64,
    /// What this instance appended, reported by its counter store.
    appends: Arc<Appends>,
    /// One pass at a time (the background loop and refunds may both ask).
    pass: tokio::sync::Mutex<Instant>,
    /// Each moved entry's lag, decision to SQL commit.
    lag: Arc<Lag>,
    /// The failpoints tests arm (shared with the engine).
    faults: Arc<crate::engine::faults::Faults>,
    moves: moves::Moves,
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
            // A new consumer has nothing pending; its first pass (the start's) reads anyway.
            retry: AtomicU64::new(ALL),
            appends: Arc::default(),
            pass: tokio::sync::Mutex::new(Instant::now()),
            lag: Arc::default(),
            faults: Arc::default(),
            moves: moves::Moves::default(),
        }
    }

    /// Its failpoints (the engine arms them).
    pub(crate) fn faults(&self) -> Arc<crate::engine::faults::Faults> {
        self.faults.clone()
    }

    /// Records each moved entry's lag (decision to SQL commit) in `lag`.
    #[must_use]
    pub fn recording_lag(mut self, lag: Arc<Lag>) -> Self {
        self.lag = lag;
        self
    }

    /// Has the drain woken by `appends` (the counter store reports to the same).
    #[must_use]
    pub fn woken_by(mut self, appends: Arc<Appends>) -> Self {
        self.appends = appends;
        self
    }

    /// One pass over every shard, until each is empty; returns how many entries were moved.
    /// Claims idle entries too, if it has not for half the claim timeout.
    pub async fn drain_once(&self) -> usize {
        self.drain_once_checked()
            .await
            .unwrap_or_else(|(moved, _)| moved)
    }

    /// [`Drainer::drain_once`], with the pass's failure (what it moved, and why it
    /// stopped): the entries it had not moved yet wait in the streams.
    pub(crate) async fn drain_once_checked(&self) -> Result<usize, (usize, String)> {
        let claim = {
            let mut last_claim = self.pass.lock().await;
            let claim = last_claim.elapsed() >= self.claim_idle / 2;
            if claim {
                *last_claim = Instant::now();
            }
            claim
        };
        self.drain_shards_checked(ALL, if claim { ALL } else { 0 }, true)
            .await
    }

    /// One pass over the streams of `shards` (bits), until each is empty, claiming idle
    /// entries in those of `claim`; returns how many entries were moved.
    ///
    /// Entries from all shards share transactions of up to [`FLUSH_AT`] entries: one
    /// commit (and one fsync) per few thousand entries rather than per shard and batch.
    async fn drain_shards(&self, shards: u64, claim: u64) -> usize {
        self.drain_shards_checked(shards, claim, false)
            .await
            .unwrap_or_else(|(moved, _)| moved)
    }

    /// [`Drainer::drain_shards`], with the pass's failure (what it moved, and why); with
    /// `every_move`, the consumes recorded in totals are moved now, else when due (moves).
    async fn drain_shards_checked(
        &self,
        shards: u64,
        claim: u64,
        every_move: bool,
    ) -> Result<usize, (usize, String)> {
        let _one_at_a_time = self.pass.lock().await;
        let retry = self.retry.swap(0, Ordering::AcqRel);
        let shards = shards | retry | claim;
        let mut moved = 0;
        let pass = async {
            self.run_pass(shards, retry, claim, &mut moved).await?;
            self.move_totals(shards, every_move, &mut moved).await
        };
        match pass.await {
            Ok(()) => Ok(moved),
            Err(error) => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %error, count, "draining the ledger streams failed; will retry");
                }
                self.retry.fetch_or(shards, Ordering::AcqRel);
                Err((moved, format!("{error:#}")))
            }
        }
    }

    /// Reads the streams of `shards` in transactions' worth, adding what each moved to
    /// `moved`. While one is inserted and acknowledged, the next is read: SQL and Redis
    /// work at the same time, so that the drain keeps up with a full load (SQL waited
    /// for every read before, and Redis for every insert).
    ///
    /// A failure leaves what was read and not acknowledged pending for this consumer,
    /// and the caller marks every shard of the pass for a reread.
    async fn run_pass(
        &self,
        shards: u64,
        retry: u64,
        claim: u64,
        moved: &mut usize,
    ) -> anyhow::Result<()> {
        if !self.ledger.appends_in_parallel() {
            return self.run_lane(shards, retry, claim, moved).await;
        }
        // Two lanes, the even shards and the odd ones: each inserts while the other reads,
        // and the ledger's database inserts two transactions at once.
        let (mut even_moved, mut odd_moved) = (0, 0);
        let (even, odd) = tokio::join!(
            self.run_lane(shards & EVEN, retry, claim, &mut even_moved),
            self.run_lane(shards & !EVEN, retry, claim, &mut odd_moved),
        );
        *moved += even_moved + odd_moved;
        even.and(odd)
    }

    /// A lane of [`Drainer::run_pass`]: the streams of `shards`, one transaction's worth
    /// at a time.
    async fn run_lane(
        &self,
        shards: u64,
        retry: u64,
        claim: u64,
        moved: &mut usize,
    ) -> anyhow::Result<()> {
        if shards == 0 {
            return Ok(());
        }
        let mut cursor = Cursor::over(&self.prefix, shards, retry, claim);
        let mut next = self.gather(&mut cursor).await?;
        while !cursor.is_done() {
            let (flushed, following) = tokio::join!(self.flush(next), self.gather(&mut cursor));
            *moved += flushed?;
            next = following?;
        }
        *moved += self.flush(next).await?;
        Ok(())
    }

    /// Reads from where `cursor` is until the entries read fill a transaction or nothing
    /// is left to read.
    async fn gather(&self, cursor: &mut Cursor) -> anyhow::Result<Pass> {
        let mut pass = Pass::default();
        while let Some((stream, source)) = cursor.work.get(cursor.next) {
            let batch = self.read(stream, *source, &cursor.after).await?;
            let more = batch.len() == BATCH;
            // Pending entries stay pending until flushed: page through them by id.
            if let Some((last, _)) = batch.last() {
                cursor.after.clone_from(last);
            }
            let read = pass.entries.len();
            pass.add(stream, batch);
            // Read after the batch: at least the generation of every shard its entries
            // changed, this stream's and those of budgets shared across shards.
            if pass.entries.len() > read {
                for shard in shards_charged(stream, &pass.entries[read..]) {
                    let stream = ledger_stream(&self.prefix, shard);
                    if let Some(generation) = self.streams.generation(&stream).await? {
                        pass.generations.push((stream, generation));
                    }
                }
            }
            if !more {
                cursor.next += 1;
                cursor.after = String::from("0");
            }
            if pass.entries.len() >= FLUSH_AT {
                break;
            }
        }
        Ok(pass)
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

    /// Inserts what `pass` holds in one transaction, then acknowledges and deletes it;
    /// returns how many stream entries it moved.
    async fn flush(&self, pass: Pass) -> anyhow::Result<usize> {
        if pass.entries.is_empty() {
            return Ok(0);
        }
        if crate::engine::faults::fault!(self, "drain.insert") {
            anyhow::bail!("failpoint drain.insert: inserting the drained entries failed");
        }
        let refused = match self.ledger.append(&pass.entries).await {
            Ok(_) => {
                self.lag
                    .observe_committed(pass.entries.iter().map(|e| e.at));
                Vec::new()
            }
            // One entry breaking a constraint must not hold back the others.
            Err(LedgerError::Corrupt(why)) => self.insert_in_parts(&pass.entries, &why).await?,
            Err(error) => return Err(error.into()),
        };
        // A stream entry that records several ledger entries is acknowledged once, and
        // only if none of them was refused.
        let refused: std::collections::HashSet<(usize, String)> =
            refused.iter().map(|&i| pass.origins[i].clone()).collect();
        let mut acks: Vec<Vec<String>> = vec![Vec::new(); pass.streams.len()];
        for origin in pass.origins {
            let (stream, id) = &origin;
            if !refused.contains(&origin) && acks[*stream].last() != Some(id) {
                acks[*stream].push(origin.1);
            }
        }
        // In SQL now: the shards' floors rise to the generations read after the batches,
        // before the entries leave the streams (a failure leaves them pending, read again).
        // Each shard once, at the highest generation read (a shared budget's shard is read
        // after the batches of several streams).
        let mut highest = std::collections::BTreeMap::<u16, u64>::new();
        for (stream, generation) in &pass.generations {
            if let Some(shard) = crate::keys::shard_of(stream) {
                let floor = highest.entry(shard).or_default();
                *floor = (*floor).max(*generation);
            }
        }
        let floors: Vec<(u16, u64)> = highest.into_iter().collect();
        if !floors.is_empty() {
            self.ledger
                .record_generations(&self.prefix, &floors)
                .await?;
            self.streams.raise_floors(&floors);
        }
        if crate::engine::faults::fault!(self, "drain.ack") {
            anyhow::bail!("failpoint drain.ack: acknowledging the drained entries failed");
        }
        let mut moved = 0;
        for (stream, ids) in pass.streams.into_iter().zip(acks) {
            self.streams.ack(&stream, &ids).await?;
            moved += ids.len();
        }
        Ok(moved)
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
        static SITE: Throttle = Throttle::new();
        if let Some(count) = SITE.event() {
            tracing::warn!(error = %why, entries = entries.len(), count, "a ledger batch was refused; inserting it in parts");
        }
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
                    static SITE: Throttle = Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::error!(error = %why, id = %entries[start].id, count, "the SQL ledger refused an entry; it is left pending in Redis");
                    }
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

    /// Runs passes forever: one over every shard at the start, then one whenever this
    /// instance appended, over the shards it appended to, and (while it is the `janitor`)
    /// one every half claim timeout over the shards whose streams hold anything. After a
    /// pass that filled a transaction the next may start at once; otherwise it waits a
    /// little, so that entries gather into larger transactions (a refund that needs its
    /// charge in SQL drains at once, through [`Drainer::drain_once`]).
    pub(crate) fn spawn(self: Arc<Self>, janitor: Arc<Janitor>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let sweep_every = self.sweep_every();
            let mut swept: Option<Instant> = None;
            self.drain_once().await;
            let mut floors_read = Instant::now();
            loop {
                if floors_read.elapsed() >= FLOORS_EVERY {
                    floors_read = Instant::now();
                    self.read_floors().await;
                }
                let sweep_in = swept.map_or(Duration::ZERO, |at| {
                    sweep_every.saturating_sub(at.elapsed())
                });
                let wait = match self.retry.load(Ordering::Acquire) {
                    0 => sweep_in,
                    _ => sweep_in.min(IDLE_PAUSE),
                };
                tokio::select! {
                    () = self.appends.wake.notified() => {}
                    () = tokio::time::sleep(wait.min(FLOORS_EVERY)) => {}
                }
                let mut shards = self.appends.take();
                let mut claim = 0;
                if janitor.held() && swept.is_none_or(|at| at.elapsed() >= sweep_every) {
                    swept = Some(Instant::now());
                    claim = self.waiting_shards().await.unwrap_or(0);
                    shards |= claim;
                } else if !janitor.held() {
                    // Sweep at once on becoming the janitor.
                    swept = None;
                }
                if shards == 0 && self.retry.load(Ordering::Acquire) == 0 && !self.moves.due() {
                    continue;
                }
                let pause = match self.drain_shards(shards, claim).await {
                    0 => Duration::ZERO,
                    n if n < FLUSH_AT => BUSY_PAUSE,
                    _ => Duration::ZERO,
                };
                tokio::time::sleep(pause).await;
            }
        })
    }

    /// How often the janitor measures every stream: half the claim timeout, within
    /// 250 ms and 15 s.
    fn sweep_every(&self) -> Duration {
        (self.claim_idle / 2).clamp(Duration::from_millis(250), Duration::from_secs(15))
    }

    /// The shards (bits) whose streams hold entries; `None` if the store did not answer.
    async fn waiting_shards(&self) -> Option<u64> {
        let mut shards = 0;
        for shard in 0..SHARDS {
            let length = self
                .streams
                .stream_len(&ledger_stream(&self.prefix, shard))
                .await
                .ok()?;
            if length > 0 || self.streams.totals_len(shard).await.ok()? > 0 {
                shards |= 1 << shard;
            }
        }
        Some(shards)
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
    /// Whether an entry with the id `entry` (a ledger entry's) was appended to `stream`
    /// within `window` (wall-clock ms) and waits there still, reading `page` at a time.
    pub(crate) async fn appended(
        &self,
        stream: &str,
        window: (i64, i64),
        entry: &str,
        page: usize,
    ) -> Result<bool, StoreError> {
        let (mut from, to) = window;
        // A bounded number of pages: a window holds a few seconds of one shard's entries.
        for _ in 0..1_000 {
            let read = self.streams.range(stream, from, to, page).await?;
            let found = read.iter().any(|(_, text)| {
                crate::engine::codec::decode_entries(text)
                    .is_ok_and(|entries| entries.iter().any(|e| e.id.to_string() == entry))
            });
            if found {
                return Ok(true);
            }
            let next = read
                .last()
                .and_then(|(id, _)| id.split('-').next()?.parse::<i64>().ok());
            match next {
                Some(last) if read.len() == page && last < to => from = last.max(from + 1),
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

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
    /// not yet in SQL), and consumes in their totals; `None` if the store did not answer.
    pub(crate) async fn waiting_in(&self, shards: impl IntoIterator<Item = u16>) -> Option<u64> {
        let mut total = 0;
        for shard in shards {
            total += self
                .streams
                .stream_len(&ledger_stream(&self.prefix, shard))
                .await
                .ok()?;
            total += self.streams.totals_len(shard).await.ok()?;
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
