//! Keeping this instance's policy cache in step with changes made through any instance.
//!
//! [`Refresher::start`] runs two background tasks, stopped when the [`Refresher`] is dropped:
//! - **listen** (Postgres): waits for the announcement that every write makes at commit and
//!   reloads at once. A lost connection is re-established with backoff; a failing `LISTEN`
//!   is logged and retried, never fatal.
//! - **poll** (every store): reads the change marker every `poll` interval and reloads only
//!   when it moved, plus a full reload every [`FULL_RELOAD_EVERY`] regardless. This is the
//!   safety net for announcements lost while the listener reconnects, and the only path on
//!   SQLite.
//!
//! A failure leaves the cache serving its last good snapshot. Each task logs a run of
//! failures twice: when it begins and when it ends, not on every attempt.

use super::{Caches, FeedEvent, PolicyStore, PolicyStoreError, StoreResult};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

/// How often the cache is rebuilt even when the change marker did not move (which covers
/// rows edited by hand, without the marker).
pub(crate) const FULL_RELOAD_EVERY: Duration = Duration::from_secs(60);

/// The first pause before subscribing again after a failure; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest pause between two subscription attempts.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The background tasks that keep a [`PolicyCache`] current; dropping this stops them.
#[derive(Debug)]
pub(crate) struct Refresher {
    tasks: Vec<JoinHandle<()>>,
}

impl Refresher {
    /// Starts listening to and polling `store` for changes, on the current Tokio runtime.
    pub(crate) fn start(store: Arc<dyn PolicyStore>, cache: Caches, poll: Duration) -> Self {
        let tasks = vec![
            tokio::spawn(listen(store.clone(), cache.clone())),
            tokio::spawn(poll_changes(store, cache, poll)),
        ];
        Self { tasks }
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        // The tasks loop forever: without this they would outlive the server they serve.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Reloads on every announced change, subscribing again whenever the subscription fails.
async fn listen(store: Arc<dyn PolicyStore>, cache: Caches) {
    let mut outage = Outage::new("listen");
    let mut retry = RETRY_FIRST;
    loop {
        if let Some(subscription) = outage.record(store.subscribe().await) {
            let Some(mut feed) = subscription else {
                return; // this store announces nothing: polling alone keeps the cache current
            };
            retry = RETRY_FIRST;
            // Whatever was announced while nobody listened is lost: catch up first.
            outage.record(super::refresh_if_changed(&cache, store.as_ref()).await);
            loop {
                match feed.next().await {
                    Ok(FeedEvent::Changed) => {
                        outage.record(super::refresh_if_changed(&cache, store.as_ref()).await);
                    }
                    Ok(FeedEvent::Lost) => {
                        tracing::debug!("the policy change subscription lost its connection");
                        break;
                    }
                    Err(error) => {
                        outage.record::<()>(Err(error));
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// Reloads when the change marker moved, checking every `every`, and fully every
/// [`FULL_RELOAD_EVERY`].
async fn poll_changes(store: Arc<dyn PolicyStore>, cache: Caches, every: Duration) {
    let mut outage = Outage::new("poll");
    // Startup loaded the cache just before: the first check is one interval away.
    let mut loaded_at = Instant::now();
    let mut ticks = tokio::time::interval_at(loaded_at + every, every);
    // After a slow round (a store timing out), carry on at the normal pace, without a burst.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if loaded_at.elapsed() >= FULL_RELOAD_EVERY {
            if outage
                .record(super::reload(&cache, store.as_ref()).await)
                .is_some()
            {
                loaded_at = Instant::now();
            }
        } else {
            outage.record(super::refresh_if_changed(&cache, store.as_ref()).await);
        }
    }
}

/// Logs a run of failures once when it begins and once when it ends, not per attempt.
#[derive(Debug)]
struct Outage {
    task: &'static str,
    since: Option<Instant>,
}

impl Outage {
    fn new(task: &'static str) -> Self {
        Self { task, since: None }
    }

    /// Notes the outcome of one attempt and hands back its value if it succeeded.
    fn record<T>(&mut self, result: StoreResult<T>) -> Option<T> {
        match result {
            Ok(value) => {
                if let Some(since) = self.since.take() {
                    tracing::info!(
                        task = self.task,
                        failing_for_ms = since.elapsed().as_millis() as u64,
                        "keeping the policy cache current works again"
                    );
                }
                Some(value)
            }
            Err(error) => {
                if self.since.is_none() {
                    tracing::warn!(
                        task = self.task,
                        error = %chain(&error),
                        "keeping the policy cache current failed; serving the last loaded \
                         policies and retrying"
                    );
                    self.since = Some(Instant::now());
                }
                None
            }
        }
    }
}

/// The error and its causes, on one line.
fn chain(error: &PolicyStoreError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_the_refresher_stops_its_tasks() {
        let (store, file) = crate::policy::tests::sqlite_store("refresh").await;
        let cache = Caches::new();
        crate::policy::reload(&cache, store.as_ref())
            .await
            .expect("loading");
        let refresher = Refresher::start(store.clone(), cache, Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(Arc::strong_count(&store) > 1, "the poller holds the store");

        drop(refresher);
        // Each task drops its handle on the store once its abort has been processed.
        for _ in 0..100 {
            if Arc::strong_count(&store) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            Arc::strong_count(&store),
            1,
            "no task outlives the refresher"
        );
        drop(std::fs::remove_file(file));
    }
}
