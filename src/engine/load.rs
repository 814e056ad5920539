//! Whether this instance is shedding load right now.
//!
//! Admission control reports every request it sheds, and the counter store every answer
//! it gets. While the instance sheds (and for a second after):
//! - the engine answers a failed counter-store call as overload, never with a degraded
//!   allow: a flood must never switch the limits off, even if Redis fails meanwhile;
//! - if the store also answered within the last second, a call that ran out of time is
//!   taken for what it most likely is, our own saturation (its reply waited behind the
//!   flood in this process), and the circuit breaker does not count it. A store that has
//!   not answered for a second is failing, flood or not: its timeouts count, so a real
//!   outage still opens the breaker, and fail-open applies again once the flood is over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after the last shed request the instance still counts as overloaded.
const OVERLOAD_LASTS: Duration = Duration::from_secs(1);

/// The instance's load signal; one per application, shared by admission control, the
/// engine and the counter store.
#[derive(Debug)]
pub struct Load {
    started: Instant,
    /// Milliseconds since `started` of the last shed request, plus one; 0 for never.
    last_shed: AtomicU64,
    /// Likewise, of the counter store's last answer.
    last_answer: AtomicU64,
}

impl Default for Load {
    fn default() -> Self {
        Self::new()
    }
}

impl Load {
    /// An instance that has shed nothing.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            last_shed: AtomicU64::new(0),
            last_answer: AtomicU64::new(0),
        }
    }

    /// Records that a request was shed now.
    pub fn shed(&self) {
        self.shed_at(Instant::now());
    }

    /// Whether a request was shed within the last second.
    pub fn overloaded(&self) -> bool {
        self.overloaded_at(Instant::now())
    }

    /// Records that the counter store answered a call now.
    pub fn answered(&self) {
        let now = self.millis(Instant::now()).saturating_add(1);
        self.last_answer.fetch_max(now, Ordering::Relaxed);
    }

    /// Whether this instance sheds load while the store still answers: a call that ran
    /// out of time meanwhile is most likely ours, not the store's.
    pub fn saturated(&self) -> bool {
        let now = Instant::now();
        self.overloaded_at(now) && within(&self.last_answer, self.millis(now))
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX)
    }

    fn shed_at(&self, at: Instant) {
        self.last_shed
            .fetch_max(self.millis(at).saturating_add(1), Ordering::Relaxed);
    }

    fn overloaded_at(&self, at: Instant) -> bool {
        within(&self.last_shed, self.millis(at))
    }
}

/// Whether the instant recorded in `last` (ms since start, plus one; 0 for never) is
/// within [`OVERLOAD_LASTS`] before `now_ms`.
fn within(last: &AtomicU64, now_ms: u64) -> bool {
    match last.load(Ordering::Relaxed) {
        0 => false,
        last => {
            let window = u64::try_from(OVERLOAD_LASTS.as_millis()).unwrap_or(u64::MAX);
            now_ms.saturating_add(1) <= last.saturating_add(window)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_counts_as_overloaded_for_a_second_after_it_shed_a_request() {
        let load = Load::new();
        let t0 = load.started + Duration::from_secs(5);
        assert!(!load.overloaded_at(t0), "nothing shed yet");
        load.shed_at(t0);
        assert!(load.overloaded_at(t0));
        assert!(load.overloaded_at(t0 + Duration::from_millis(999)));
        assert!(!load.overloaded_at(t0 + Duration::from_millis(1_001)));
        load.shed_at(t0 + Duration::from_secs(2));
        assert!(load.overloaded_at(t0 + Duration::from_millis(2_500)));
    }
}
