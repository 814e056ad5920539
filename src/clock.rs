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

/// The system clock moved by an offset measured against the counter store's clock (Redis's
/// `TIME`): with Redis, every instance places requests in their windows, expires holds and
/// stamps entries by Redis's time, so instances whose clocks disagree decide alike.
#[derive(Debug, Default)]
pub(crate) struct OffsetClock {
    /// The store's clock minus this machine's, in milliseconds.
    offset_ms: AtomicI64,
    /// Whether `offset_ms` was measured yet (before that, the system clock as it is).
    measured: std::sync::atomic::AtomicBool,
}

impl OffsetClock {
    /// Sets the measured offset: the store's clock minus this machine's, milliseconds.
    pub(crate) fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Release);
        self.measured.store(true, Ordering::Release);
    }

    /// The offset last measured; `None` before the first measurement.
    pub(crate) fn offset_ms(&self) -> Option<i64> {
        self.measured
            .load(Ordering::Acquire)
            .then(|| self.offset_ms.load(Ordering::Acquire))
    }

    /// This machine's wall clock moved by the offset, Unix milliseconds.
    pub(crate) fn now_ms(&self) -> i64 {
        Utc::now().timestamp_millis() + self.offset_ms.load(Ordering::Acquire)
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.now_ms())
            .single()
            .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
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
