//! Failpoints: named steps of the engine's work where a test injects a fault, as TiKV does
//! with the `fail` crate. Ours belong to one engine, so tests running side by side in one
//! process never see each other's faults. They exist only in test builds (the
//! `failpoints` feature, which the tests turn on); elsewhere [`fault!`] is `false`, and
//! costs nothing. An armed point fails, or pauses: the work waits there for good, so that
//! a test can kill the instance at exactly that step.
//!
//! | point | where | the fault |
//! |---|---|---|
//! | `unit.commit` | a change's entries go to the ledger writer (`engine::unit`) | the commit fails: the change is undone and answered 503 |
//! | `store.reply_lost` | a consume or hold's Redis call returned | the reply is lost: answered 503 as a timeout, though Redis applied it |
//! | `drain.ack` | a drained batch is in SQL, before its stream entries are acknowledged | the acknowledgement fails: the entries are read and inserted again |
//! | `drain.move` | a shard's consumes recorded in totals were handed out, before their folded rows are inserted | the insert fails: the same content is handed out again |
//! | `drain.moved` | the folded rows are in SQL, before the hand-out ends | ending it fails: the same content is handed out again, and its rows are not inserted twice |
//! | `sweep.expire` | the sweeper is about to expire a due hold | the expiry fails: the hold waits for the next sweep |
//! | `snapshot.save` | a snapshot was taken, before it is saved | the save fails: the previous snapshot stays |
//! | `crossslot.finalize` | a consume across Redis Cluster slots reserved every slot, before its finalize | the finalize is never sent: the attempt is abandoned and answered 503 (paused: it stays in flight) |
//! | `crossslot.events` | a give-back's share in other Redis Cluster slots was given, before the alert events it tells are recorded | recording fails: the pending share stays, and the sweeper gives it again (a replay) and records them |

/// Every failpoint, for tests that pick one at random.
pub const POINTS: [&str; 7] = [
    "unit.commit",
    "store.reply_lost",
    "drain.ack",
    "drain.move",
    "drain.moved",
    "sweep.expire",
    "snapshot.save",
];

/// The failpoints of a Redis Cluster's consumes across slots (not among [`POINTS`]: most
/// stores never reach them).
pub const CLUSTER_POINTS: [&str; 2] = ["crossslot.finalize", "crossslot.events"];

/// The failpoints of the Redis ledger streams' drain before its SQL insert (not among
/// [`POINTS`]: the embedded default has no streams).
pub const STREAM_POINTS: [&str; 1] = ["drain.insert"];

/// What an armed point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The step fails.
    Fail,
    /// The step never ends: the work waits there until its instance is killed (a test
    /// kills it at that step).
    Pause,
    /// The work waits there until the point is disarmed, then goes on unharmed (a test
    /// changes the world at that step).
    Hold,
}

/// The failpoints armed in one engine.
#[derive(Debug, Default)]
pub struct Faults {
    /// Whether any is armed: the one load an unarmed point costs.
    any: std::sync::atomic::AtomicBool,
    /// The armed points.
    armed: std::sync::Mutex<std::collections::HashMap<String, Fault>>,
    /// How many times work reached a paused point.
    paused: std::sync::atomic::AtomicUsize,
}

impl Faults {
    fn armed(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Fault>> {
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `point` fail every time it is reached, until [`Faults::clear`].
    pub fn arm(&self, point: &str) {
        self.arm_with(point, Fault::Fail);
    }

    /// Makes `point` do `fault` every time it is reached, until [`Faults::clear`].
    pub fn arm_with(&self, point: &str, fault: Fault) {
        assert!(
            POINTS.contains(&point)
                || CLUSTER_POINTS.contains(&point)
                || STREAM_POINTS.contains(&point),
            "no failpoint named {point}"
        );
        self.armed().insert(point.to_owned(), fault);
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Disarms every point.
    pub fn clear(&self) {
        self.armed().clear();
        self.any.store(false, std::sync::atomic::Ordering::Release);
    }

    /// How many times work reached a paused or held point (and waited there).
    pub fn paused(&self) -> usize {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether `point` fails now; a paused point never returns.
    #[cfg(feature = "failpoints")]
    pub(crate) async fn hit(&self, point: &str) -> bool {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        let fault = self.armed().get(point).copied();
        match fault {
            Some(Fault::Fail) => true,
            Some(Fault::Pause) => {
                self.paused
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                std::future::pending().await
            }
            Some(Fault::Hold) => {
                self.paused
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                while self.armed().contains_key(point) {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                false
            }
            None => false,
        }
    }
}

/// Whether the failpoint `$point` of `$engine` fails now (a paused one never returns);
/// `false` outside test builds.
macro_rules! fault {
    ($engine:expr, $point:literal) => {{
        #[cfg(feature = "failpoints")]
        let failed = $engine.faults.hit($point).await;
        // Read all the same, so that a build without failpoints keeps no unread field.
        #[cfg(not(feature = "failpoints"))]
        let failed = {
            let _ = &$engine.faults;
            false
        };
        failed
    }};
}
pub(crate) use fault;
