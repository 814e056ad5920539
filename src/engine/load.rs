//! Whether this instance is shedding load right now.
//!
//! Admission control reports every request it sheds. While it does (and for a second
//! after), a counter-store call that times out is taken for what it most likely is, our
//! own saturation (the reply waited behind the flood in this process), not a Redis
//! outage: the circuit breaker does not count it, and the engine answers it as overload,
//! never with a degraded allow. Refused connections and errors still count as Redis
//! failing, whatever the load.

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

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX)
    }

    fn shed_at(&self, at: Instant) {
        self.last_shed
            .fetch_max(self.millis(at).saturating_add(1), Ordering::Relaxed);
    }

    fn overloaded_at(&self, at: Instant) -> bool {
        match self.last_shed.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let window = u64::try_from(OVERLOAD_LASTS.as_millis()).unwrap_or(u64::MAX);
                self.millis(at).saturating_add(1) <= last.saturating_add(window)
            }
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
