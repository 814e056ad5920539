//! Retention: a background task that deletes ledger entries older than the configured
//! number of days (`QUOTA_LEDGER_RETENTION_DAYS`).
//!
//! It runs shortly after start and then hourly. Each sweep deletes in batches of
//! [`Retention::batch`] oldest entries, one short statement each, with a pause between
//! batches, so it never holds long locks or starves the writers. A failed sweep is logged
//! and simply tried again at the next tick.

use crate::clock::Clock;
use crate::engine::ledger::{LedgerError, LedgerStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// When and how much the retention task deletes.
#[derive(Debug, Clone)]
pub struct Retention {
    /// How long entries are kept.
    pub keep: chrono::Duration,
    /// Delay before the first sweep (lets the service start up first).
    pub first_sweep_after: Duration,
    /// Time between sweeps.
    pub every: Duration,
    /// Entries deleted per statement.
    pub batch: u32,
    /// Pause between two batches of one sweep.
    pub pause: Duration,
}

impl Retention {
    /// Keeps entries `days` days, sweeping a minute after start and then hourly, in
    /// batches of 1,000 with a 100 ms pause.
    pub fn days(days: u32) -> Self {
        Self {
            keep: chrono::Duration::days(i64::from(days)),
            first_sweep_after: Duration::from_secs(60),
            every: Duration::from_secs(3_600),
            batch: 1_000,
            pause: Duration::from_millis(100),
        }
    }

    /// One sweep: deletes every entry older than the retention, as of `clock`'s now,
    /// batch by batch; returns how many went.
    pub async fn sweep(
        &self,
        store: &dyn LedgerStore,
        clock: &dyn Clock,
    ) -> Result<u64, LedgerError> {
        // Computed once, so a sweep has an end even while the clock moves on.
        let Some(cutoff) = clock.now().checked_sub_signed(self.keep) else {
            return Ok(0); // the retention reaches back before any representable time
        };
        let mut total = 0;
        loop {
            let deleted = store.delete_older_than(cutoff, self.batch).await?;
            total += deleted;
            if deleted < u64::from(self.batch) {
                return Ok(total);
            }
            tokio::time::sleep(self.pause).await;
        }
    }

    /// Starts the periodic task on the current Tokio runtime; it stops when the returned
    /// [`RetentionTask`] is dropped. A sweep is skipped, with an error logged, while
    /// `needs_all` names a policy that needs the whole ledger (a lifetime window, created
    /// through an instance that keeps the ledger for ever).
    pub fn spawn(
        self,
        store: Arc<dyn LedgerStore>,
        clock: Arc<dyn Clock>,
        needs_all: Arc<dyn Fn() -> Option<String> + Send + Sync>,
    ) -> RetentionTask {
        let handle = tokio::spawn(async move {
            tokio::time::sleep(self.first_sweep_after).await;
            let mut ticks = tokio::time::interval(self.every);
            // Ticks missed while a long sweep ran are not made up for.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await; // the first tick is immediate
                if let Some(policy) = needs_all() {
                    tracing::error!(
                        policy,
                        "ledger retention skipped: a lifetime window counts the whole ledger; \
                         set QUOTA_LEDGER_RETENTION_DAYS=forever"
                    );
                    continue;
                }
                match self.sweep(store.as_ref(), clock.as_ref()).await {
                    Ok(0) => tracing::debug!("ledger retention: nothing to delete"),
                    Ok(deleted) => tracing::info!(
                        deleted,
                        keep_days = self.keep.num_days(),
                        "ledger retention deleted old entries"
                    ),
                    Err(error) => {
                        let cause = std::error::Error::source(&error).map(ToString::to_string);
                        tracing::warn!(
                            error = %error,
                            cause = cause.as_deref(),
                            "ledger retention failed; retrying at the next sweep"
                        );
                    }
                }
            }
        });
        RetentionTask { handle }
    }
}

/// The running retention task; dropping it stops the task (tests start and stop many
/// services in one process, and a stopped service must not keep deleting).
#[derive(Debug)]
pub struct RetentionTask {
    handle: JoinHandle<()>,
}

impl Drop for RetentionTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_is_hourly_in_batches_of_a_thousand() {
        let r = Retention::days(400);
        assert_eq!(r.keep, chrono::Duration::days(400));
        assert_eq!(r.every, Duration::from_secs(3_600));
        assert_eq!(r.batch, 1_000);
        assert!(r.first_sweep_after < r.every);
    }
}
