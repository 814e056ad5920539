//! The dispatcher: every half second it fans new alert events out to the endpoints that
//! want them, and attempts the deliveries due, at most [`IN_FLIGHT`] at once per endpoint.
//! An attempt is a signed `POST` of the event, answered 2xx within [`TIMEOUT`] or failed
//! (another status, a redirect, which is never followed, no answer, or an address that is
//! no longer public). A failed delivery is due again after a backoff with jitter: the
//! first three retries within a minute, then up to hourly, for as long as the endpoint is
//! enabled. An endpoint whose attempts have all failed for [`DISABLE_AFTER`] is disabled
//! (its deliveries wait, pending, until it is enabled again): `webhook.disabled` is logged.

use super::store::{Attempted, Delivery, Webhook, WebhookStore};
use super::{sign, target};
use crate::clock::Clock;
use chrono::{DateTime, Duration, Utc};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How long one attempt may take.
pub(crate) const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Deliveries attempted at once per endpoint.
pub(crate) const IN_FLIGHT: i64 = 4;

/// Deliveries of an endpoint claimed at once, and recorded in one write once attempted
/// ([`IN_FLIGHT`] at a time): a burst of crossings costs the database a write per 32.
const CLAIMED: i64 = 8 * IN_FLIGHT;

/// How many attempt timeouts a claim lasts: one per group of [`IN_FLIGHT`], and two more.
const CLAIM_LEASE: i32 = (CLAIMED / IN_FLIGHT) as i32 + 2;

/// An endpoint failing this long is disabled.
pub(crate) fn disable_after() -> Duration {
    Duration::hours(24)
}

/// The pause before retry `attempt` (1 = after the first failed attempt), before jitter:
/// 5, 10 and 20 s (the first three within a minute), then 2, 10 and 30 min, then hourly.
pub(crate) fn backoff(attempt: i64) -> Duration {
    match attempt {
        ..=1 => Duration::seconds(5),
        2 => Duration::seconds(10),
        3 => Duration::seconds(20),
        4 => Duration::minutes(2),
        5 => Duration::minutes(10),
        6 => Duration::minutes(30),
        _ => Duration::hours(1),
    }
}

/// [`backoff`] with up to a fifth more, drawn at random, so that endpoints that failed
/// together do not all come back at once.
fn jittered(attempt: i64) -> Duration {
    let base = backoff(attempt);
    let fifth = base.num_milliseconds() / 5;
    let draw = i64::from(uuid::Uuid::new_v4().as_bytes()[0]);
    base + Duration::milliseconds(fifth * draw / 255)
}

/// What the dispatcher counts, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Attempts answered 2xx.
    pub(crate) delivered: AtomicU64,
    /// Attempts that failed.
    pub(crate) failed: AtomicU64,
    /// Endpoints disabled after failing for a day.
    pub(crate) disabled: AtomicU64,
}

/// The dispatcher of one instance.
pub(crate) struct Dispatcher {
    store: WebhookStore,
    clock: Arc<dyn Clock>,
    allow_private: bool,
    /// Whether this instance dispatches now (the janitor, in Redis mode).
    leads: Arc<dyn Fn() -> bool + Send + Sync>,
    pub(crate) counts: Arc<Counts>,
    /// When delivered deliveries were last forgotten (Unix ms).
    forgot_at_ms: std::sync::atomic::AtomicI64,
    /// An HTTP client per host and the addresses it was checked to resolve to: building
    /// one (its TLS roots) costs more than an attempt, and it keeps connections open.
    clients: std::sync::Mutex<
        std::collections::HashMap<(String, Vec<std::net::SocketAddr>), reqwest::Client>,
    >,
}

/// How long one endpoint's round may go on taking due deliveries, [`IN_FLIGHT`] at a time.
const ROUND: std::time::Duration = std::time::Duration::from_secs(2);

/// The most clients kept (each host with its addresses); past it, all are let go.
const CLIENTS: usize = 256;

/// How long the delivery log keeps a delivery once made.
fn keep_delivered() -> Duration {
    Duration::days(7)
}

impl Dispatcher {
    pub(crate) fn new(
        store: WebhookStore,
        clock: Arc<dyn Clock>,
        allow_private: bool,
        leads: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        Self {
            store,
            clock,
            allow_private,
            leads,
            counts: Arc::default(),
            forgot_at_ms: std::sync::atomic::AtomicI64::new(0),
            clients: std::sync::Mutex::default(),
        }
    }

    /// Runs [`Dispatcher::tick`] every half second until the task is aborted.
    pub(crate) fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                if (self.leads)() {
                    if let Err(error) = self.tick().await {
                        static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                        if let Some(count) = SITE.event() {
                            tracing::warn!(error = %error, count, "dispatching webhooks failed; will try again");
                        }
                    }
                }
            }
        })
    }

    /// One round: fan out, then attempt what is due, every endpoint at once.
    pub(crate) async fn tick(&self) -> Result<(), super::store::StoreError> {
        let now = self.clock.now();
        // Hourly: the log forgets deliveries made a week ago.
        let last = self.forgot_at_ms.load(Ordering::Relaxed);
        if now.timestamp_millis() - last >= 3_600_000 {
            self.forgot_at_ms
                .store(now.timestamp_millis(), Ordering::Relaxed);
            self.store.forget_delivered(now - keep_delivered()).await?;
        }
        let endpoints: Vec<Webhook> = self
            .store
            .list()
            .await?
            .into_iter()
            .filter(|w| w.enabled)
            .collect();
        if endpoints.is_empty() {
            return Ok(());
        }
        // Events up to here only: one with a lower `seq` may still commit after them.
        let upto = self.store.settled_event_seq().await?;
        let mut rounds = Vec::new();
        for endpoint in endpoints {
            while self.store.fan_out(&endpoint, now, 500, upto).await? == 500 {}
            rounds.push(self.deliver_due(endpoint, now));
        }
        for result in join_all(rounds).await {
            result?;
        }
        Ok(())
    }

    /// Attempts `endpoint`'s due deliveries, [`IN_FLIGHT`] at a time, batch after batch
    /// for up to [`ROUND`].
    async fn deliver_due(
        &self,
        mut endpoint: Webhook,
        now: DateTime<Utc>,
    ) -> Result<(), super::store::StoreError> {
        let started = std::time::Instant::now();
        let mut now = now;
        loop {
            let more = self.deliver_batch(&mut endpoint, now).await?;
            if !more || started.elapsed() >= ROUND || !endpoint.enabled {
                return Ok(());
            }
            now = self.clock.now();
        }
    }

    /// Claims up to [`CLAIMED`] of `endpoint`'s due deliveries and attempts them,
    /// [`IN_FLIGHT`] at once, until a group has a failure (those not attempted then are
    /// due again at once); records the batch in one write. Whether it found that many and
    /// none failed (more may be due).
    async fn deliver_batch(
        &self,
        endpoint: &mut Webhook,
        now: DateTime<Utc>,
    ) -> Result<bool, super::store::StoreError> {
        // Time for every group to time out, and more: no other round claims them meanwhile.
        let until = now + Duration::from_std(TIMEOUT).unwrap_or_default() * CLAIM_LEASE;
        let due = self.store.claim(&endpoint.id, now, until, CLAIMED).await?;
        if due.is_empty() {
            return Ok(false);
        }
        let full = i64::try_from(due.len()).unwrap_or(0) >= CLAIMED;
        let group = usize::try_from(IN_FLIGHT).unwrap_or(1);
        let mut outcomes = Vec::with_capacity(due.len());
        for deliveries in due.chunks(group) {
            let attempts = deliveries.iter().map(|d| self.attempt(endpoint, d));
            let results = join_all(attempts.collect()).await;
            let failed = results.iter().any(Result::is_err);
            outcomes.extend(results);
            if failed {
                break;
            }
        }
        let released = &due[outcomes.len()..];
        let now = self.clock.now();
        let mut failed_any = false;
        let mut delivered_any = false;
        let mut attempted = Vec::with_capacity(due.len());
        for (delivery, outcome) in due.iter().zip(outcomes) {
            attempted.push(match outcome {
                Ok(status) => {
                    self.counts.delivered.fetch_add(1, Ordering::Relaxed);
                    delivered_any = true;
                    Attempted {
                        delivery,
                        status: Some(status),
                        error: None,
                        next: None,
                    }
                }
                Err((status, error)) => {
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    failed_any = true;
                    Attempted {
                        delivery,
                        status,
                        error: Some(error),
                        next: Some(now + jittered(delivery.attempts + 1)),
                    }
                }
            });
        }
        self.store.attempted(&attempted, released, now).await?;
        self.note_health(endpoint, delivered_any, failed_any, now)
            .await?;
        Ok(full && !failed_any)
    }

    /// Keeps when an endpoint began failing, and disables one failing for a day.
    async fn note_health(
        &self,
        endpoint: &mut Webhook,
        delivered: bool,
        failed: bool,
        now: DateTime<Utc>,
    ) -> Result<(), super::store::StoreError> {
        let before = endpoint.clone();
        if delivered {
            endpoint.failing_since = None;
        } else if failed {
            let since = *endpoint.failing_since.get_or_insert(now);
            if now - since >= disable_after() {
                endpoint.enabled = false;
                endpoint.disabled_at = Some(now);
                self.counts.disabled.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    event = "webhook.disabled",
                    webhook_id = endpoint.id,
                    failing_since = %since,
                    "a webhook endpoint failed every attempt for a day: disabled; its deliveries wait until it is enabled again"
                );
            }
        }
        if *endpoint != before {
            self.store.update(endpoint).await?;
        }
        Ok(())
    }

    /// One attempt: the answer's status if 2xx, else the status (if any) and why.
    async fn attempt(
        &self,
        endpoint: &Webhook,
        d: &Delivery,
    ) -> Result<i64, (Option<i64>, String)> {
        let url = target::parse(&endpoint.url).map_err(|e| (None, e.to_string()))?;
        let addresses = target::resolve(&url, self.allow_private)
            .await
            .map_err(|e| (None, e.to_string()))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let client = self
            .client(host, addresses)
            .map_err(|e| (None, e.to_string()))?;
        let now = self.clock.now();
        let timestamp = now.timestamp();
        let signature = sign::signature(
            &endpoint.signing_secrets(now),
            &d.event_id,
            timestamp,
            &d.payload,
        )
        .ok_or_else(|| {
            (
                None,
                "the endpoint's secret is not a signing secret".to_owned(),
            )
        })?;
        let answer = client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &d.event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(d.payload.clone())
            .send()
            .await
            .map_err(|e| (None, without_url(&e)))?;
        let status = i64::from(answer.status().as_u16());
        match answer.status().is_success() {
            true => Ok(status),
            false => Err((Some(status), format!("answered {status}"))),
        }
    }
}

impl Dispatcher {
    /// The client for `host` at `addresses` (checked just now), made once.
    fn client(
        &self,
        host: String,
        mut addresses: Vec<std::net::SocketAddr>,
    ) -> Result<reqwest::Client, reqwest::Error> {
        addresses.sort_unstable();
        let key = (host, addresses);
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .resolve_to_addrs(&key.0, &key.1)
            .build()?;
        if clients.len() >= CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// A request error's text without its URL (which may carry a token): what failed, and
/// the innermost cause (a refused connection, a certificate not trusted).
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "no answer within 10 s"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "the request failed"
    };
    let mut cause = std::error::Error::source(error);
    let mut innermost = None;
    while let Some(source) = cause {
        innermost = Some(source.to_string());
        cause = source.source();
    }
    match innermost {
        Some(why) if !error.is_timeout() => format!("{kind}: {why}"),
        _ => kind.to_owned(),
    }
}

/// Awaits every future of `futures` at once, on this task; their outputs in order.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, slot) in pinned.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(output) => *slot = Some(output),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_three_retries_come_within_a_minute_and_then_hourly_at_most() {
        let first_three: i64 = (1..=3).map(|a| jittered(a).num_milliseconds()).sum();
        assert!(first_three <= 60_000, "{first_three} ms");
        let mut total = Duration::zero();
        for attempt in 1..=40 {
            let pause = backoff(attempt);
            assert!(pause <= Duration::hours(1));
            total += pause;
        }
        assert!(
            total >= disable_after(),
            "retries span at least a day: {total}"
        );
    }
}
