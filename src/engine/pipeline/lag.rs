//! Ledger lag: how long after its decision an entry's row is committed in SQL. The drain
//! (Redis mode) and the group-commit writer (embedded default) observe every entry they
//! commit; `/metrics` exports the histogram as `quota_ledger_lag_seconds`. Both times are
//! the engine's clock's: an entry's `at`, and its commit observed on the same clock.

use crate::clock::{Clock, SystemClock};
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the latest commit tells how far behind the writer is (see [`Lag::behind`]): past
/// it, a writer that commits nothing (SQL is down, or nothing waits) is not behind.
pub const RECENT: Duration = Duration::from_secs(1);

/// Upper bounds of the buckets, in seconds (`+Inf` follows).
pub const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A histogram of lags, shared by the writers of one application.
pub struct Lag {
    /// The engine's clock: entries carry its time, so the lag is measured on it too.
    clock: Arc<dyn Clock>,
    /// Per bucket (not cumulative), the last one for `+Inf`.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
    /// When the latest commit was observed (Unix ms; 0 before the first).
    latest_commit_ms: AtomicI64,
    /// The lag of the oldest entry of that commit, in ms.
    latest_oldest_ms: AtomicI64,
}

/// The histogram as read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LagSnapshot {
    /// `(upper bound in seconds, entries in that bucket alone)`; `f64::INFINITY` for `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the lags, in seconds.
    pub sum: f64,
    /// Entries observed.
    pub count: u64,
}

impl Default for Lag {
    fn default() -> Self {
        Self::on(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for Lag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lag")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl Lag {
    /// An empty histogram measured on `clock` (the engine's).
    pub fn on(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            counts: Default::default(),
            sum_micros: AtomicU64::default(),
            latest_commit_ms: AtomicI64::default(),
            latest_oldest_ms: AtomicI64::default(),
        }
    }

    /// Records the entries decided at `decided`, committed now on the clock.
    pub fn observe_committed(&self, decided: impl Iterator<Item = DateTime<Utc>>) {
        self.observe_all(self.clock.now(), decided);
    }

    /// [`Lag::behind`] now, on the clock.
    pub fn behind_now(&self, threshold: Duration) -> bool {
        self.behind(self.clock.now(), threshold)
    }

    /// Records the entries decided at `decided`, committed at `committed` (a lag below zero,
    /// from clocks apart, counts as zero).
    pub fn observe_all(
        &self,
        committed: DateTime<Utc>,
        decided: impl Iterator<Item = DateTime<Utc>>,
    ) {
        let mut oldest = 0;
        for at in decided {
            let micros = (committed - at)
                .num_microseconds()
                .unwrap_or(i64::MAX)
                .max(0);
            oldest = oldest.max(micros);
            let seconds = micros as f64 / 1e6;
            let bucket = BUCKETS
                .iter()
                .position(|bound| seconds <= *bound)
                .unwrap_or(BUCKETS.len());
            self.counts[bucket].fetch_add(1, Ordering::Relaxed);
            self.sum_micros
                .fetch_add(micros.unsigned_abs(), Ordering::Relaxed);
        }
        self.latest_oldest_ms
            .store(oldest / 1_000, Ordering::Relaxed);
        self.latest_commit_ms
            .store(committed.timestamp_millis(), Ordering::Relaxed);
    }

    /// Whether the writer is falling behind: its latest commit, within [`RECENT`] of `now`,
    /// carried an entry decided more than `threshold` before it. A writer that commits
    /// nothing is not behind: while SQL is down entries wait in Redis, bounded by
    /// `QUOTA_LEDGER_BACKLOG_MAX`, and requests are not slowed for an outage.
    pub fn behind(&self, now: DateTime<Utc>, threshold: Duration) -> bool {
        let latest = self.latest_commit_ms.load(Ordering::Relaxed);
        let recent = i64::try_from(RECENT.as_millis()).unwrap_or(i64::MAX);
        let threshold = i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX);
        latest > 0
            && now.timestamp_millis().saturating_sub(latest) <= recent
            && self.latest_oldest_ms.load(Ordering::Relaxed) > threshold
    }

    /// The histogram now.
    pub fn snapshot(&self) -> LagSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        LagSnapshot {
            buckets: BUCKETS
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .zip(counts.iter().copied())
                .collect(),
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count: counts.iter().sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn each_lag_lands_in_its_bucket_and_a_negative_one_counts_as_zero() {
        let lag = Lag::default();
        let now = Utc::now();
        let decided = [
            now - Duration::milliseconds(3),
            now - Duration::milliseconds(700),
            now - Duration::seconds(90),
            now + Duration::seconds(1),
        ];
        lag.observe_all(now, decided.into_iter());
        let snapshot = lag.snapshot();
        assert_eq!(snapshot.count, 4);
        let count_at = |bound: f64| {
            snapshot
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map(|(_, n)| *n)
        };
        assert_eq!(
            count_at(0.005),
            Some(2),
            "3 ms, and the one from the future"
        );
        assert_eq!(count_at(1.0), Some(1));
        assert_eq!(
            count_at(f64::INFINITY),
            Some(1),
            "90 s is past the last bound"
        );
        assert!((snapshot.sum - 90.703).abs() < 1e-6, "{}", snapshot.sum);
    }

    #[test]
    fn the_writer_is_behind_while_its_latest_recent_commit_carried_an_old_entry() {
        let lag = Lag::default();
        let now = Utc::now();
        let threshold = std::time::Duration::from_millis(500);
        assert!(!lag.behind(now, threshold), "nothing committed yet");
        lag.observe_all(now, [now - Duration::milliseconds(100)].into_iter());
        assert!(!lag.behind(now, threshold), "100 ms behind");
        lag.observe_all(
            now,
            [
                now - Duration::milliseconds(10),
                now - Duration::milliseconds(800),
            ]
            .into_iter(),
        );
        assert!(lag.behind(now, threshold), "its oldest entry waited 800 ms");
        assert!(
            !lag.behind(now + Duration::seconds(2), threshold),
            "no commit for 2 s (SQL down, or nothing waits): not behind"
        );
        lag.observe_all(now, [now - Duration::milliseconds(20)].into_iter());
        assert!(!lag.behind(now, threshold), "caught up");
    }
}
