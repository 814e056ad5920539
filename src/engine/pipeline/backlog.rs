//! The bound on the ledger backlog: entries that wait in the Redis streams for the drain.
//!
//! While SQL is down, every allowed consume leaves its entry in Redis memory, and nothing
//! else bounds it: Redis would fill, then refuse writes or evict. Past `max` waiting
//! entries (`QUOTA_LEDGER_BACKLOG_MAX`, all shards together) consumes and holds are
//! answered 503 `ledger-backlog-full` before they charge anything, whatever
//! `QUOTA_ON_STORE_ERROR` says, and they are served again by themselves once the drain has
//! moved entries into SQL.
//!
//! The count is every shard's stream length, measured by each instance every
//! [`MEASURE_EVERY`] (a Redis Cluster cannot count all shards in one atomic step), plus
//! the entries this instance appended since its last measure. One instance alone is
//! therefore never past the bound; with several, each may pass it by what the others
//! appended within one measure interval. A measure that fails keeps the last figure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often an instance measures the backlog.
pub(crate) const MEASURE_EVERY: Duration = Duration::from_millis(250);

/// How often an instance reads the counter store's memory settings (Redis's
/// `maxmemory-policy` may be changed on a live server).
pub(crate) const MEMORY_LOOK_EVERY: Duration = Duration::from_secs(5);

/// The bound, and what is known of the backlog.
#[derive(Debug)]
pub struct Backlog {
    max: u64,
    /// Waiting entries at the last measure.
    measured: AtomicU64,
    /// Entries this instance appended since (approximately: see [`Backlog::measured`]).
    appended: AtomicU64,
    /// One measure at a time (the watch and a `/metrics` scrape may both ask): two that
    /// started together would both take the same appends off.
    pub(crate) measuring: tokio::sync::Mutex<()>,
}

impl Backlog {
    /// A bound of `max` waiting entries (at least 1).
    pub fn new(max: u64) -> Self {
        Self {
            max: max.max(1),
            measured: AtomicU64::new(0),
            appended: AtomicU64::new(0),
            measuring: tokio::sync::Mutex::new(()),
        }
    }

    /// The bound.
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// Entries waiting, as far as this instance knows: the last measure (0 before the
    /// first) plus what it appended since.
    fn waiting(&self) -> u64 {
        self.measured
            .load(Ordering::Acquire)
            .saturating_add(self.appended.load(Ordering::Acquire))
    }

    /// Whether entries may wait, as far as this instance knows: it appended since the last
    /// measure, or that measure found some. An idle instance does not measure: the first
    /// entry it appends makes it measure again within [`MEASURE_EVERY`].
    pub(crate) fn may_wait(&self) -> bool {
        self.waiting() > 0
    }

    /// Whether no entry may be added: the backlog is at its bound.
    pub(crate) fn is_full(&self) -> bool {
        self.waiting() >= self.max
    }

    /// This instance appended `entries` to the streams.
    pub(crate) fn appended(&self, entries: u64) {
        self.appended.fetch_add(entries, Ordering::AcqRel);
    }

    /// What this instance had appended when a measure starts (pass it to
    /// [`Backlog::measured`]).
    pub(crate) fn measure_starts(&self) -> u64 {
        self.appended.load(Ordering::Acquire)
    }

    /// A measure that started when [`Backlog::measure_starts`] said `appended_before` found
    /// `total` entries waiting. What was appended before it started is in `total`; what
    /// was appended while it ran may be counted twice, which errs on the full side.
    pub(crate) fn measured(&self, total: u64, appended_before: u64) {
        self.measured.store(total, Ordering::Release);
        // Never below zero, whatever the order of calls: a wrapped count would read as full.
        let _ = self
            .appended
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |appended| {
                Some(appended.saturating_sub(appended_before))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_is_full_at_its_bound_counting_what_was_appended_since_the_measure() {
        let backlog = Backlog::new(10);
        assert_eq!(backlog.waiting(), 0);
        backlog.appended(10);
        assert!(
            backlog.is_full(),
            "what it appended counts before any measure"
        );
        let start = backlog.measure_starts();
        backlog.measured(8, start);
        assert_eq!(backlog.waiting(), 8, "the 10 are in the measure");
        backlog.appended(1);
        assert!(!backlog.is_full());
        backlog.appended(1);
        assert!(backlog.is_full(), "8 measured + 2 appended");
        // The drain moved everything; the next measure starts after those 2 appends.
        let start = backlog.measure_starts();
        backlog.appended(1); // while measuring: counted again, on the safe side
        backlog.measured(1, start);
        assert_eq!(backlog.waiting(), 2);
        assert!(!backlog.is_full());
        // A second measure that started at the same point takes nothing off twice.
        backlog.measured(1, start);
        assert_eq!(backlog.waiting(), 1);
        assert!(!backlog.is_full(), "not wrapped around to full");
    }
}
