//! The counter store a new application decides with: in process (the embedded default),
//! or Redis (standalone, a cluster or Sentinel's primary, over TLS or not) with the drain
//! that moves its ledger streams into SQL.

use super::embedded;
use crate::config::Settings;
use crate::counters::memory::MemoryCounterStore;
use crate::counters::redis::RedisCounterStore;
use crate::engine::deployment::{Durability, Embedded, Streamed};
use crate::engine::ledger::LedgerStore;
use crate::engine::load::Load;
use crate::engine::pipeline::backlog::Backlog;
use crate::engine::pipeline::drain::{Appends, Drainer};
use crate::engine::pipeline::lag::Lag;
use crate::engine::state::Replay;
use crate::engine::store::CounterStore;
use anyhow::Context;
use std::sync::Arc;

/// The counter store of a new application.
pub(super) struct Counters {
    pub(super) store: Arc<dyn CounterStore>,
    /// In process, or Redis with its drain, backlog bound and shards.
    pub(super) durability: Arc<dyn Durability>,
    /// In-process: the same store, empty, for the snapshot and the ledger to be replayed
    /// into, and snapshotted from at shutdown.
    pub(super) embedded: Option<embedded::Embedded>,
}

/// A fresh in-process store, to replay the ledger into: a shard's before it is written
/// to Redis, or the whole horizon to compare with the live counters (`counters verify`).
pub(super) fn scratch_store() -> Arc<dyn Replay> {
    Arc::new(MemoryCounterStore::new())
}

/// The counter store `settings` name: in-process without `REDIS_URL`; else Redis, with
/// the drain that moves its ledger streams into `ledger`.
pub(super) async fn counter_store(
    settings: &Settings,
    ledger: &Arc<dyn LedgerStore>,
    load: &Arc<Load>,
    lag: &Arc<Lag>,
    time: Option<Arc<crate::clock::OffsetClock>>,
) -> anyhow::Result<Counters> {
    if !settings.uses_redis() {
        let store = Arc::new(MemoryCounterStore::new());
        let snapshots = crate::ledger::snapshot::connect(&settings.database_url).await?;
        let undo = store.clone();
        let embedded = embedded::Embedded { store, snapshots };
        return Ok(Counters {
            store: embedded.store.clone(),
            durability: Arc::new(Embedded::new(embedded.ports(), undo)),
            embedded: Some(embedded),
        });
    }
    let appends = Arc::new(Appends::default());
    let store = RedisCounterStore::reaching(redis_target(settings)?, settings.redis_timeout)
        .await
        .context("connecting to Redis (REDIS_URL)")?;
    let store = match time {
        Some(time) => store.keeping_time(time, settings.max_clock_offset).await,
        None => store,
    }
    .requiring_replicas(settings.redis_min_replicas);
    if let Err(crate::engine::store::StoreError::Misconfigured(why)) =
        crate::engine::store::CounterStore::ping(&store).await
    {
        tracing::warn!("{why}");
    }
    let store = Arc::new(
        store
            .judged_by(load.clone())
            .allowing_eviction(settings.redis_allow_eviction)
            .prefixed(&settings.redis_prefix)
            .reporting_to(appends.clone()),
    );
    let drain = Arc::new(
        Drainer::new(
            store.clone(),
            ledger.clone(),
            settings.redis_prefix.clone(),
            settings.ledger_claim_idle,
        )
        .recording_lag(lag.clone())
        .woken_by(appends),
    );
    Ok(Counters {
        store: store.clone(),
        durability: Arc::new(Streamed::new(
            drain,
            Backlog::new(settings.ledger_backlog_max),
            store,
            crate::ledger::snapshot::connect(&settings.database_url).await?,
            settings.redis_prefix.clone(),
        )),
        embedded: None,
    })
}

/// How to reach Redis, as `settings` say: the nodes (one, a cluster, or Sentinel's
/// primary) and the TLS files, read now; a plaintext connection to a host other than
/// loopback is logged as a warning.
fn redis_target(settings: &Settings) -> anyhow::Result<crate::counters::redis::Target> {
    use crate::counters::redis::{Certificates, Target};
    let target = match (&settings.redis_sentinel, settings.redis_cluster) {
        (Some(sentinel), _) => Target::sentinel(
            &sentinel.sentinels,
            &sentinel.master,
            settings.redis_urls.first().map(String::as_str),
        )?,
        (None, true) => Target::cluster(&settings.redis_urls)?,
        (None, false) => match settings.redis_urls.as_slice() {
            [url] => Target::standalone(url)?,
            _ => anyhow::bail!(
                "REDIS_URL lists several nodes: set REDIS_CLUSTER=true for a Redis Cluster"
            ),
        },
    };
    let files = &settings.redis_tls;
    let certificates = Certificates::from_files(
        files.ca_file.as_deref(),
        files.cert_file.as_deref(),
        files.key_file.as_deref(),
    )?;
    if target.is_tls() {
        return Ok(target.with_certificates(certificates));
    }
    if certificates.given() {
        tracing::warn!("QUOTA_REDIS_CA_FILE, QUOTA_REDIS_CERT_FILE or QUOTA_REDIS_KEY_FILE is set, but REDIS_URL is not rediss://: the files are not used");
    }
    for host in target.hosts() {
        if !crate::db::is_loopback(&host) {
            tracing::warn!(host = %host, "Redis is reached without TLS over the network; use rediss:// unless the network is private");
        }
    }
    Ok(target)
}
