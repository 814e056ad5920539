//! Warnings that can repeat once per request (a store down, load being shed) are written
//! at most once per second per call site, each line carrying how many events it stands
//! for. Under a flood, one line per failed request would cost the CPU the service needs,
//! and bury everything else; the metrics still count every event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether spans are exported (`telemetry` sets it once, at start).
static SPANS_EXPORTED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported over OTLP: only then do requests and their store calls make
/// spans beyond the request's own (one relaxed load when they do not).
pub fn spans_exported() -> bool {
    SPANS_EXPORTED.load(Ordering::Relaxed)
}

/// Records that spans are exported from now on.
pub(crate) fn export_spans() {
    SPANS_EXPORTED.store(true, Ordering::Relaxed);
}

/// How often one call site writes a line, at most.
const EVERY: Duration = Duration::from_secs(1);

/// The state of one call site's warning: a `static` beside it.
#[derive(Debug)]
pub(crate) struct Throttle {
    /// When this site last wrote a line.
    last: Mutex<Option<Instant>>,
    /// Events since that line.
    events: AtomicU64,
    /// The least time between two lines.
    every: Duration,
}

impl Throttle {
    /// A site that has written nothing yet.
    pub(crate) const fn new() -> Self {
        Self {
            last: Mutex::new(None),
            events: AtomicU64::new(0),
            every: EVERY,
        }
    }

    /// A site that writes at most one line a minute (a condition that lasts, not an event).
    pub(crate) const fn per_minute() -> Self {
        Self {
            last: Mutex::new(None),
            events: AtomicU64::new(0),
            every: Duration::from_secs(60),
        }
    }

    /// Counts one event; returns how many events the line due now stands for (this one
    /// included), or `None` when this site wrote a line less than a second ago.
    pub(crate) fn event(&self) -> Option<u64> {
        self.event_at(Instant::now())
    }

    fn event_at(&self, now: Instant) -> Option<u64> {
        self.events.fetch_add(1, Ordering::Relaxed);
        // A poisoned lock only means a panic elsewhere while it was held: the instant
        // inside is still a complete value.
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| now.duration_since(at) < self.every) {
            return None;
        }
        *last = Some(now);
        Some(self.events.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_writes_at_most_one_line_a_second_counting_what_it_skipped() {
        let site = Throttle::new();
        let t0 = Instant::now();
        assert_eq!(site.event_at(t0), Some(1), "the first event is written");
        for i in 1..=99 {
            let at = t0 + Duration::from_millis(i * 10 - 5);
            assert_eq!(site.event_at(at), None, "{i}");
        }
        let next = t0 + EVERY;
        assert_eq!(site.event_at(next), Some(100), "99 skipped, and this one");
        assert_eq!(site.event_at(next + EVERY * 3), Some(1));
    }
}
