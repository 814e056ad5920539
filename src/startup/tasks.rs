//! The background work of a running application: what it starts beside the HTTP server
//! (the janitor, the webhook dispatcher, the ledger drain, the backlog watch, checkpoints,
//! verifies and voids, key-use notes, partitions, retention), each ended with it.

use super::counters::Counters;
use crate::access::KeyRing;
use crate::api::AppState;
use crate::clock::Clock;
use crate::config::Settings;
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerStore;
use crate::ledger::retention::{Retention, RetentionTask};
use crate::policy::{Caches, PolicyStore};
use crate::webhooks::WebhookStore;
use actix_web::web;
use std::sync::Arc;
use std::time::Duration;

/// Background tasks that end with the application (tests run many apps in one process).
#[derive(Default)]
pub(super) struct BackgroundTasks(pub(super) Vec<tokio::task::JoinHandle<()>>);

impl BackgroundTasks {
    /// Announces this instance in `service_instances` (what the upgrade gates read) and,
    /// on Postgres, looks after the ledger's partitions.
    pub(super) async fn announce(&mut self, pool: crate::db::Pool, clock: &Arc<dyn Clock>) {
        if let crate::db::Pool::Postgres(postgres) = &pool {
            look_at_partitions(postgres, clock.now()).await;
            self.0.push(crate::ledger::partitions::spawn(
                postgres.clone(),
                clock.clone(),
            ));
        }
        self.0
            .push(crate::ledger::instances::spawn(pool, clock.clone()));
    }

    /// The janitor (the one instance that sweeps, reclaims and checkpoints), started, and
    /// the ledger drain (Redis), which it leads.
    pub(super) async fn janitor(
        &mut self,
        settings: &Settings,
        counters: &Counters,
    ) -> Arc<Janitor> {
        let janitor = Arc::new(Janitor::new(
            counters.store.clone(),
            &settings.redis_prefix,
            settings.ledger_claim_idle,
        ));
        // The janitor's first sweeps may start at once.
        janitor.keep().await;
        self.0.push(janitor.clone().spawn());
        self.0
            .extend(counters.durability.start_drain(&janitor).await);
        janitor
    }

    /// The webhook endpoints' store and the dispatcher that delivers their events while
    /// this instance is the janitor, started; and the dispatcher's counts (metrics).
    pub(super) async fn webhooks(
        &mut self,
        settings: &Settings,
        clock: &Arc<dyn Clock>,
        janitor: &Arc<Janitor>,
    ) -> anyhow::Result<(WebhookStore, Arc<crate::webhooks::Counts>)> {
        let webhooks = WebhookStore::new(crate::db::open(&settings.database_url, 2).await?);
        let leads = {
            let janitor = janitor.clone();
            Arc::new(move || janitor.held()) as Arc<dyn Fn() -> bool + Send + Sync>
        };
        let dispatcher = Arc::new(crate::webhooks::Dispatcher::new(
            webhooks.clone(),
            clock.clone(),
            settings.webhook_allow_private,
            leads,
        ));
        let counts = dispatcher.counts.clone();
        self.0.push(dispatcher.spawn());
        Ok((webhooks, counts))
    }

    /// The service's periodic work: notes of API keys' last use, verifies
    /// (`QUOTA_VERIFY_INTERVAL_S`), voids of calls answered 503 (Redis), the backlog watch
    /// and checkpoints (Redis).
    pub(super) async fn periodic_work(&mut self, state: &web::Data<AppState>, settings: &Settings) {
        self.0.push(spawn_key_use_notes(
            state.policies.clone(),
            state.caches.keys.clone(),
        ));
        if let Some(every) = settings.verify_interval {
            let engine = state.engine.clone();
            self.0.push(tokio::spawn(async move {
                engine.recovery().verify_every(every).await
            }));
        }
        let watches = state.engine.start_watches(settings.checkpoint_every).await;
        self.0.extend(watches);
    }
}

impl Drop for BackgroundTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// How often the last use of each API key is written down: off the hot path, so that a
/// request only notes the second in memory.
const KEY_USE_NOTES_EVERY: Duration = Duration::from_secs(5);

/// Writes down every [`KEY_USE_NOTES_EVERY`] when the keys used since were last used; a
/// failure is logged and the uses are written next time.
fn spawn_key_use_notes(
    store: Arc<dyn PolicyStore>,
    keys: Arc<KeyRing>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(KEY_USE_NOTES_EVERY).await;
            let uses = keys.unwritten_uses();
            if uses.is_empty() {
                continue;
            }
            match store.note_key_uses(&uses).await {
                Ok(()) => keys.written(&uses),
                Err(error) => {
                    static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::warn!(error = %error, count, "writing down when API keys were last used failed; will try again");
                    }
                }
            }
        }
    })
}

/// The start's look at the ledger's partitions (Postgres): converts a small ledger once
/// every live instance can write to a partitioned one, and creates the days ahead. A
/// failure is logged: the running instance looks again later, and inserts create the
/// partitions they need.
pub(super) async fn look_at_partitions(pool: &sqlx::PgPool, now: chrono::DateTime<chrono::Utc>) {
    use crate::ledger::partitions::{look_at_start, Look};
    match look_at_start(pool, now).await {
        Ok(Some(Look::Waiting { oldest })) => tracing::info!(
            oldest,
            "the ledger stays one table while an instance of an earlier release is live"
        ),
        Ok(None) => tracing::info!(
            "the ledger is large: it will be partitioned in the background, without a pause"
        ),
        // A conversion logs itself.
        Ok(Some(_)) => {}
        Err(error) => {
            let cause = std::error::Error::source(&error).map(ToString::to_string);
            tracing::warn!(error = %error, cause = cause.as_deref(), "looking at the ledger's partitions failed; will try again");
        }
    }
}

/// The ledger's retention task (`None` when the ledger is kept for ever); an error when a
/// policy has a lifetime window, which would lose the usage retention deletes.
pub(super) fn start_retention(
    settings: &Settings,
    ledger: &Arc<dyn LedgerStore>,
    clock: &Arc<dyn Clock>,
    caches: &Caches,
) -> anyhow::Result<Option<RetentionTask>> {
    let Some(days) = settings.ledger_retention_days else {
        return Ok(None);
    };
    if let Some(policy) = caches.policies.lifetime_policy() {
        anyhow::bail!(
            "policy {policy} has a lifetime window, whose usage is rebuilt from the whole \
             ledger; QUOTA_LEDGER_RETENTION_DAYS={days} would delete it: set \
             QUOTA_LEDGER_RETENTION_DAYS=forever (or delete the policy)"
        );
    }
    let cache = caches.policies.clone();
    let needs_all = Arc::new(move || cache.lifetime_policy().map(|id| id.to_string()));
    let task = Retention::days(days).spawn(ledger.clone(), clock.clone(), needs_all);
    Ok(Some(task))
}
