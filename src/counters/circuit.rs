//! A small circuit breaker, so that a dead Redis does not cost every request a full timeout.
//!
//! Closed: calls go through. After [`CircuitBreaker::THRESHOLD`] transient failures in a row
//! it opens: calls fail at once for [`CircuitBreaker::COOLDOWN`]. Then one call at a time is
//! let through as a trial; a success closes the circuit, a failure keeps it open for
//! another cooldown. Lock-free: two atomics, no `.await` while deciding.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Trips after repeated transient failures; see the module docs.
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which the circuit stays open.
    open_until_ms: AtomicI64,
    epoch: Instant,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicI64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl CircuitBreaker {
    /// Transient failures in a row that open the circuit.
    pub(crate) const THRESHOLD: u32 = 3;
    /// How long an open circuit fails calls before letting a trial through.
    pub(crate) const COOLDOWN: Duration = Duration::from_millis(500);

    fn now_ms(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether a call may go ahead now (closed, or this call is the one trial of an open circuit).
    pub(crate) fn allow(&self) -> bool {
        if self.failures.load(Ordering::Acquire) < Self::THRESHOLD {
            return true;
        }
        let now = self.now_ms();
        let until = self.open_until_ms.load(Ordering::Acquire);
        if now < until {
            return false;
        }
        let next = now + Self::COOLDOWN.as_millis() as i64;
        // Only the caller that moves the deadline gets the trial.
        self.open_until_ms
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Records a call that reached the store and got an answer.
    pub(crate) fn succeeded(&self) {
        if self.failures.swap(0, Ordering::AcqRel) >= Self::THRESHOLD {
            tracing::info!("counter store answers again; circuit closed");
        }
    }

    /// Records a transient failure (unreachable, timed out).
    pub(crate) fn failed(&self) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures == Self::THRESHOLD {
            let until = self.now_ms() + Self::COOLDOWN.as_millis() as i64;
            self.open_until_ms.store(until, Ordering::Release);
            tracing::warn!("counter store failing; circuit opened");
        }
    }

    /// Whether calls are currently being refused.
    pub(crate) fn is_open(&self) -> bool {
        self.failures.load(Ordering::Acquire) >= Self::THRESHOLD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_opens_after_repeated_failures_and_closes_after_a_successful_trial() {
        let breaker = CircuitBreaker::default();
        for _ in 0..CircuitBreaker::THRESHOLD {
            assert!(breaker.allow());
            breaker.failed();
        }
        assert!(breaker.is_open());
        assert!(!breaker.allow(), "open: calls fail fast");
        std::thread::sleep(CircuitBreaker::COOLDOWN + Duration::from_millis(20));
        assert!(breaker.allow(), "after the cooldown one trial goes through");
        assert!(!breaker.allow(), "but only one");
        breaker.succeeded();
        assert!(!breaker.is_open());
        assert!(breaker.allow());
    }

    #[test]
    fn a_success_resets_the_count_of_failures() {
        let breaker = CircuitBreaker::default();
        breaker.failed();
        breaker.failed();
        breaker.succeeded();
        breaker.failed();
        assert!(!breaker.is_open());
    }
}
