//! Failpoints: named steps of the engine's work where a test injects a fault, as TiKV does
//! with the `fail` crate. Ours belong to one engine, so tests running side by side in one
//! process never see each other's faults. They exist only in test builds (the
//! `failpoints` feature, which the tests turn on); elsewhere [`fault!`] is `false`, and
//! costs nothing.
//!
//! | point | where | the fault |
//! |---|---|---|
//! | `unit.commit` | a change's entries go to the ledger writer (`engine::unit`) | the commit fails: the change is undone and answered 503 |
//! | `store.reply_lost` | a consume or hold's Redis call returned | the reply is lost: answered 503 as a timeout, though Redis applied it |
//! | `drain.ack` | a drained batch is in SQL, before its stream entries are acknowledged | the acknowledgement fails: the entries are read and inserted again |
//! | `sweep.expire` | the sweeper is about to expire a due hold | the expiry fails: the hold waits for the next sweep |
//! | `snapshot.save` | a snapshot was taken, before it is saved | the save fails: the previous snapshot stays |

/// Every failpoint, for tests that pick one at random.
pub const POINTS: [&str; 5] = [
    "unit.commit",
    "store.reply_lost",
    "drain.ack",
    "sweep.expire",
    "snapshot.save",
];

/// The failpoints armed in one engine.
#[derive(Debug, Default)]
pub struct Faults {
    /// Whether any is armed: the one load an unarmed point costs.
    any: std::sync::atomic::AtomicBool,
    /// The armed points.
    armed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Faults {
    fn armed(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `point` fail every time it is reached, until [`Faults::clear`].
    pub fn arm(&self, point: &str) {
        assert!(POINTS.contains(&point), "no failpoint named {point}");
        self.armed().insert(point.to_owned());
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Disarms every point.
    pub fn clear(&self) {
        self.armed().clear();
        self.any.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether `point` fails now.
    #[cfg(feature = "failpoints")]
    pub(crate) fn fails(&self, point: &str) -> bool {
        self.any.load(std::sync::atomic::Ordering::Acquire) && self.armed().contains(point)
    }
}

/// Whether the failpoint `$point` of `$engine` fails now; `false` outside test builds.
macro_rules! fault {
    ($engine:expr, $point:literal) => {{
        #[cfg(feature = "failpoints")]
        let failed = $engine.faults.fails($point);
        #[cfg(not(feature = "failpoints"))]
        let failed = false;
        failed
    }};
}
pub(crate) use fault;
