//! Where time comes from: the system clock in production, a hand-set clock in tests.

use chrono::{DateTime, TimeZone, Utc};
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of the current time. Window math takes `now` from here, never from the OS.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The operating system's clock.
///
/// Several instances sharing one Redis must agree on time (NTP): a clock that runs ahead
/// or behind by `s` seconds moves that instance's period boundaries by `s`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to; for deterministic tests.
#[derive(Debug)]
pub struct FakeClock {
    millis: AtomicI64,
}

impl FakeClock {
    /// A clock stopped at `at`.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self {
            millis: AtomicI64::new(at.timestamp_millis()),
        }
    }

    /// Moves the clock to `at` (backwards too, to simulate skew).
    pub fn set(&self, at: DateTime<Utc>) {
        self.millis.store(at.timestamp_millis(), Ordering::SeqCst);
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: chrono::Duration) {
        self.millis
            .fetch_add(duration.num_milliseconds(), Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        let millis = self.millis.load(Ordering::SeqCst);
        Utc.timestamp_millis_opt(millis)
            .single()
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
    }
}
