//! Wiring: stores, caches and the HTTP server, built the same way in production and tests.

mod embedded;

use crate::access::{Gate, KeyRing};
use crate::admission::{Admission, Limits};
use crate::api::extract::{problem_for_bare_errors, MAX_BODY_BYTES};
use crate::api::problem::ApiError;
use crate::api::{self, AppState};
use crate::clock::{Clock, SystemClock};
use crate::config::{Secret, Settings};
use crate::counters::memory::MemoryCounterStore;
use crate::counters::redis::RedisCounterStore;
use crate::engine::deployment::{Deployment, Streamed};
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerStore;
use crate::engine::load::Load;
use crate::engine::pipeline::backlog::Backlog;
use crate::engine::pipeline::drain::{Appends, Drainer};
use crate::engine::pipeline::lag::Lag;
use crate::engine::pipeline::writer::LedgerWriter;
use crate::engine::state::Replay;
use crate::engine::state::ScratchStore;
use crate::engine::store::CounterStore;
use crate::engine::{Engine, Ports, Restored};
use crate::ledger::retention::{Retention, RetentionTask};
use crate::metrics::Metrics;
use crate::policy::{self, Caches, PolicyStore, Refresher};
use actix_web::middleware::{from_fn, ErrorHandlers};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;
use utoipa::OpenApi;
use utoipa_actix_web::AppExt;
use utoipa_swagger_ui::SwaggerUi;

/// How long a stopping server waits for in-flight requests.
const SHUTDOWN_GRACE_SECONDS: u64 = 10;

/// A built service, bound to its port and ready to run.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    admin_token: Secret,
    admin_token_generated: bool,
    /// Keeps the policy cache in step with other instances' changes. Its tasks stop when
    /// it is dropped: when `run_until_stopped` returns, or with an app that never ran.
    refresher: Refresher,
    /// Deletes old ledger entries until the application is dropped.
    _retention: Option<RetentionTask>,
    /// The ledger drain; stopped when the application is.
    _tasks: BackgroundTasks,
    /// Envoy's rate limit service on its own runtime (`QUOTA_GRPC_LISTEN`); stopped when
    /// the application is.
    grpc: Option<crate::grpc::GrpcServer>,
    /// Releases expired holds; stopped between two sweeps before the snapshot is taken.
    sweeper: embedded::Sweeper,
    /// Snapshots the embedded default's counters every few minutes (`None` on Redis).
    periodic: Option<embedded::Periodic>,
    /// How the in-process counters were rebuilt at start (`None` on Redis).
    restored: Option<Restored>,
    /// What the handlers share; kept so that tests can drive background work themselves.
    state: web::Data<AppState>,
}

/// Background tasks that end with the application (tests run many apps in one process).
#[derive(Default)]
struct BackgroundTasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for BackgroundTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Counts the ledger entries waiting in the Redis streams every
/// [`MEASURE_EVERY`](crate::engine::pipeline::backlog::MEASURE_EVERY) while any may wait (this
/// instance appended since the last count, or the last count found some), which bounds
/// consumes by `QUOTA_LEDGER_BACKLOG_MAX`; looks at Redis's memory settings every
/// [`MEMORY_LOOK_EVERY`](crate::engine::pipeline::backlog::MEMORY_LOOK_EVERY); and rebuilds the
/// shards that lost their epoch, as soon as a decision finds one and (the janitor only)
/// every [`SHARD_LOOK_EVERY`](crate::engine::recovery::shards::SHARD_LOOK_EVERY) (Redis only).
fn spawn_backlog_watch(state: web::Data<AppState>) -> tokio::task::JoinHandle<()> {
    use crate::engine::pipeline::backlog::{MEASURE_EVERY, MEMORY_LOOK_EVERY};
    use crate::engine::recovery::shards::SHARD_LOOK_EVERY;
    tokio::spawn(async move {
        let mut full = false;
        let mut last_look = std::time::Instant::now();
        let mut last_shard_look: Option<std::time::Instant> = None;
        loop {
            tokio::time::sleep(MEASURE_EVERY).await;
            if state.engine.backlog().is_some_and(|b| b.may_wait()) {
                state.engine.measure_backlog().await;
            }
            let janitor = state.engine.janitor().held();
            let look = janitor && last_shard_look.is_none_or(|at| at.elapsed() >= SHARD_LOOK_EVERY);
            if look {
                last_shard_look = Some(std::time::Instant::now());
            }
            state.engine.reopen_if_wanted(look).await;
            if last_look.elapsed() >= MEMORY_LOOK_EVERY {
                last_look = std::time::Instant::now();
                state.engine.counters().memory().await;
            }
            let now_full = state.engine.backlog().is_some_and(|b| b.is_full());
            if now_full != full {
                full = now_full;
                match full {
                    true => tracing::warn!("ledger backlog full: consumes are answered 503 until the drain moves entries into SQL"),
                    false => tracing::info!("ledger backlog below its bound again: consumes are served"),
                }
            }
        }
    })
}

/// The janitor's checkpoints of the ledger's replay (Redis only), `every` so often
/// (`QUOTA_CHECKPOINT_EVERY_S`): a shard whose Redis data was lost is then rebuilt from the
/// entries after the last one.
fn spawn_checkpoints(
    state: web::Data<AppState>,
    every: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    use crate::engine::recovery::checkpoint::{Checkpoints, LOOK_EVERY};
    tokio::spawn(async move {
        let mut checkpoints = Checkpoints::default();
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            if !state.engine.janitor().held() {
                // Another instance keeps them: the replayed state is dropped.
                checkpoints = Checkpoints::default();
                continue;
            }
            let due = last.elapsed() >= every;
            if due {
                last = tokio::time::Instant::now();
            }
            let result = state.engine.checkpoint_settled(&mut checkpoints, due).await;
            // Once per checkpoint due, not at every look (the ledger database may be down).
            if let (true, Err(error)) = (due, result) {
                tracing::warn!(error = %error, "checkpointing the ledger's replay failed; will retry");
            }
        }
    })
}

/// The counter store of a new application.
struct Counters {
    store: Arc<dyn CounterStore>,
    /// In process, or Redis with its drain, backlog bound and shards.
    deployment: Deployment,
    /// In-process: the same store, empty, for the snapshot and the ledger to be replayed
    /// into, and snapshotted from at shutdown.
    embedded: Option<embedded::Embedded>,
}

/// A fresh in-process store, to replay the ledger into: a shard's before it is written
/// to Redis, or the whole horizon to compare with the live counters (`counters verify`).
fn scratch_store() -> Arc<dyn Replay> {
    Arc::new(MemoryCounterStore::new())
}

/// The counter store `settings` name: in-process without `REDIS_URL`; else Redis, with
/// the drain that moves its ledger streams into `ledger`.
async fn counter_store(
    settings: &Settings,
    ledger: &Arc<dyn LedgerStore>,
    load: &Arc<Load>,
    lag: &Arc<Lag>,
    time: Option<Arc<crate::clock::OffsetClock>>,
) -> anyhow::Result<Counters> {
    if !settings.uses_redis() {
        let store = Arc::new(MemoryCounterStore::new());
        let snapshots = crate::ledger::snapshot::connect(&settings.database_url).await?;
        let embedded = embedded::Embedded { store, snapshots };
        return Ok(Counters {
            store: embedded.store.clone(),
            deployment: Deployment::Embedded(embedded.ports()),
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
        deployment: Deployment::Streamed(Streamed {
            drain,
            backlog: Backlog::new(settings.ledger_backlog_max),
            shards: store,
            cluster: settings.redis_cluster,
            checkpoints: crate::ledger::snapshot::connect(&settings.database_url).await?,
        }),
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

/// The actix server on `listener`: every route, Swagger UI, and the problem+json rewrite
/// of the errors actix answers by itself.
fn http_server(
    listener: TcpListener,
    state: web::Data<AppState>,
    gate: web::Data<Gate>,
) -> anyhow::Result<actix_web::dev::Server> {
    let spec = api::openapi::spec();
    let server = HttpServer::new(move || {
        let (app, _) = App::new()
            .into_utoipa_app()
            .openapi(api::openapi::ApiDoc::openapi())
            .configure(api::routes)
            .split_for_parts();
        app.app_data(state.clone())
            .app_data(gate.clone())
            .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
            .app_data(web::QueryConfig::default().error_handler(|error, _| {
                ApiError::Malformed(format!("invalid query string: {error}")).into()
            }))
            .app_data(web::PathConfig::default().error_handler(|error, _| {
                ApiError::NotFound(format!("invalid path: {error}")).into()
            }))
            .service(
                SwaggerUi::new("/swagger-ui/{_:.*}").url("/api-docs/openapi.json", spec.clone()),
            )
            .configure(api::console::routes)
            .default_service(web::to(api::routing::unrouted))
            // Innermost: before any extractor reads a body; its 503 still gets the
            // request id and the problem+json rewrite of the layers around it.
            .wrap(from_fn(api::admission::middleware))
            .wrap(ErrorHandlers::new().default_handler(problem_for_bare_errors))
            // Outermost, so that even the answers rewritten above carry the request id.
            .wrap(from_fn(api::request_id::middleware))
    })
    // On SIGTERM/SIGINT: stop accepting, let in-flight requests finish (at most this long).
    .shutdown_timeout(SHUTDOWN_GRACE_SECONDS)
    .listen(listener)
    .context("starting the HTTP server")?
    .run();
    Ok(server)
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

/// A fresh random token, as hex: two v4 UUIDs, 244 random bits from rand's thread-local
/// generator (a CSPRNG seeded by the operating system; uuid's `fast-rng` feature).
fn random_token() -> Secret {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    Secret::new(format!("{a}{b}"))
}

impl Application {
    /// Builds the service on the system clock; with Redis, on Redis's clock (the system
    /// clock moved by the offset measured every second), so that every instance decides by
    /// the same time.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let time = settings
            .uses_redis()
            .then(|| Arc::new(crate::clock::OffsetClock::default()));
        let clock: Arc<dyn Clock> = match &time {
            Some(time) => time.clone(),
            None => Arc::new(SystemClock),
        };
        Self::build_on(settings, clock, time).await
    }

    /// Builds the service with an explicit time source (tests use a fake clock).
    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        Self::build_on(settings, clock, None).await
    }

    /// Builds the service on `clock`; `time`, if any, is `clock` itself, kept at Redis's
    /// time by the counter store.
    #[expect(
        clippy::too_many_lines,
        reason = "the wiring: one step per component, in the order they start"
    )]
    async fn build_on(
        settings: Settings,
        clock: Arc<dyn Clock>,
        time: Option<Arc<crate::clock::OffsetClock>>,
    ) -> anyhow::Result<Self> {
        crate::tls::install_provider();
        crate::db::check_connection(&settings.database_url).await?;
        crate::db::migrate_url(&settings.database_url).await?;
        crate::ledger::upgrade::upgrade_url(&settings.database_url).await?;
        let announcements = crate::db::open_with(&settings.database_url, 1, &[]).await?;
        let policies = policy::connect(&settings.database_url).await?;
        let ledger = crate::ledger::sql::connect(&settings.database_url).await?;
        let caches = Caches::new();
        policy::reload(&caches, policies.as_ref())
            .await
            .context("loading policies and API keys into the caches")?;
        let retention = start_retention(&settings, &ledger, &clock, &caches)?;
        let refresher = Refresher::start(policies.clone(), caches.clone(), settings.policy_poll);
        let admin_token_generated = settings.admin_token.is_none();
        let admin_token = settings.admin_token.clone().unwrap_or_else(random_token);
        let gate = Arc::new(Gate::new(
            admin_token.clone(),
            settings.client_tokens.clone(),
            caches.keys.clone(),
            clock.clone(),
        ));
        let mut tasks = BackgroundTasks::default();
        if let crate::db::Pool::Postgres(pool) = &announcements {
            look_at_partitions(pool, clock.now()).await;
            tasks.0.push(crate::ledger::partitions::spawn(
                pool.clone(),
                clock.clone(),
            ));
        }
        tasks.0.push(crate::ledger::instances::spawn(
            announcements,
            clock.clone(),
        ));
        let load = Arc::new(Load::new());
        let ledger_lag = Arc::new(Lag::on(clock.clone()));
        let counters = counter_store(&settings, &ledger, &load, &ledger_lag, time.clone()).await?;
        let janitor = Arc::new(Janitor::new(
            counters.store.clone(),
            &settings.redis_prefix,
            settings.ledger_claim_idle,
        ));
        // The janitor's first sweeps may start at once.
        janitor.keep().await;
        tasks.0.push(janitor.clone().spawn());
        let webhooks =
            crate::webhooks::WebhookStore::new(crate::db::open(&settings.database_url, 2).await?);
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
        let webhook_counts = dispatcher.counts.clone();
        tasks.0.push(dispatcher.spawn());
        if let Some(drain) = counters.deployment.drain() {
            tasks.0.push(drain.clone().spawn(janitor.clone()));
        }
        let ports = Ports {
            counters: counters.store,
            writer: LedgerWriter::spawn_recording(ledger.clone(), ledger_lag.clone()),
            ledger,
            cache: caches.policies.clone(),
            clock,
            load: load.clone(),
            deployment: counters.deployment,
            scratch: Arc::new(scratch_store) as ScratchStore,
            janitor,
        };
        let engine = Engine::new(
            ports,
            settings.redis_prefix.clone(),
            settings.on_store_error,
        );
        // Before the first request: the ledger is the book of record, the in-process
        // counters its cache.
        let restored = match &counters.embedded {
            Some(embedded) => Some(embedded.restore(&engine).await?),
            None => None,
        };
        // Redis: shards without an epoch (a first start, or Redis lost its data) are
        // rebuilt from the ledger before the first request if Redis answers; else the
        // watch does it as soon as it does.
        engine.reopen_if_wanted(true).await;
        tasks
            .0
            .push(spawn_key_use_notes(policies.clone(), caches.keys.clone()));
        let state = web::Data::new(AppState {
            engine: Arc::new(engine),
            ledger_lag: ledger_lag.clone(),
            policies,
            caches,
            gate: gate.clone(),
            ledger_retention_days: settings.ledger_retention_days,
            webhooks,
            webhook_allow_private: settings.webhook_allow_private,
            webhook_counts,
            backtests: Arc::default(),
            time,
            max_clock_offset: settings.max_clock_offset,
            metrics: Arc::new(Metrics::new()),
            admission: Arc::new(
                Admission::new(
                    Limits {
                        in_flight: settings.max_in_flight,
                        queued: settings.max_queued,
                        wait: settings.queue_wait,
                    },
                    load,
                )
                .pacing(ledger_lag.clone(), settings.ledger_pace),
            ),
        });
        if let Some(every) = settings.verify_interval {
            let engine = state.engine.clone();
            tasks.0.push(tokio::spawn(
                async move { engine.verify_every(every).await },
            ));
        }
        if state.engine.counters_stream_ledger() {
            let engine = state.engine.clone();
            tasks.0.push(tokio::spawn(async move {
                engine
                    .void_every(crate::engine::recovery::void::VOID_EVERY)
                    .await;
            }));
        }
        let sweeper = embedded::Sweeper::spawn(state.clone());
        if state.engine.backlog().is_some() {
            // Before the first request, so that a full backlog is known from the start.
            state.engine.measure_backlog().await;
            tasks.0.push(spawn_backlog_watch(state.clone()));
            if let Some(every) = settings.checkpoint_every {
                tasks.0.push(spawn_checkpoints(state.clone(), every));
            }
        }
        let periodic = counters.embedded.is_some().then(|| {
            let covered = restored.and_then(|r| r.snapshot_seq);
            embedded::Periodic::spawn(state.engine.clone(), covered, settings.snapshot_entries)
        });
        let listener = TcpListener::bind(settings.listen)
            .with_context(|| format!("binding {}", settings.listen))?;
        let port = listener
            .local_addr()
            .context("reading the bound address")?
            .port();
        let server = http_server(listener, state.clone(), web::Data::from(gate.clone()))?;
        let grpc = match settings.grpc_listen {
            Some(address) => {
                let limiter = crate::grpc::RateLimiter::new(
                    state.engine.clone(),
                    state.admission.clone(),
                    state.metrics.clone(),
                    gate.clone(),
                );
                let server = crate::grpc::GrpcServer::start(address, limiter)
                    .with_context(|| format!("serving {address} (QUOTA_GRPC_LISTEN)"))?;
                tracing::info!(address = %server.address(), "serving Envoy's rate limit service (gRPC)");
                Some(server)
            }
            None => None,
        };
        Ok(Self {
            port,
            server,
            admin_token,
            admin_token_generated,
            _retention: retention,
            _tasks: tasks,
            grpc,
            sweeper,
            periodic,
            restored,
            refresher,
            state,
        })
    }

    /// The port the service listens on (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of Envoy's rate limit service (gRPC), if `QUOTA_GRPC_LISTEN` is set.
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc.as_ref().map(|server| server.address().port())
    }

    /// The admin bearer token in force.
    pub fn admin_token(&self) -> &Secret {
        &self.admin_token
    }

    /// Whether the admin token was generated (and should be shown to the operator).
    pub fn admin_token_generated(&self) -> bool {
        self.admin_token_generated
    }

    /// Serves until the server is stopped (SIGINT/SIGTERM or a handle); then, on the
    /// embedded default, saves a snapshot of the in-process counters for the next start.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        drop(self.refresher); // the background tasks end with the server
        drop(self.grpc); // and so does gRPC: nothing is decided after the snapshot below
        self.sweeper.stop().await;
        // Attempts answered 503 that Redis may have decided: voided before the drain stops.
        self.state.engine.void_settled(true).await;
        self.state.engine.janitor().give_up().await;
        if let Some(periodic) = self.periodic {
            periodic.stop().await;
            self.state.engine.snapshot_now().await;
        }
        served
    }

    /// How the in-process counters were rebuilt at start: from a snapshot and the ledger
    /// entries after it, or from the whole horizon (`None` on Redis).
    pub fn restored(&self) -> Option<Restored> {
        self.restored
    }

    /// The engine, so that tests can run background work now (`expire_due_holds`, the
    /// drain) instead of waiting for its timer.
    pub fn engine(&self) -> Arc<Engine> {
        self.state.engine.clone()
    }

    /// The admission control of `/quota/*` requests (how many are in flight).
    pub fn admission(&self) -> Arc<Admission> {
        self.state.admission.clone()
    }

    /// A handle to stop the server from elsewhere.
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }
}

/// The start's look at the ledger's partitions (Postgres): converts a small ledger once
/// every live instance can write to a partitioned one, and creates the days ahead. A
/// failure is logged: the running instance looks again later, and inserts create the
/// partitions they need.
async fn look_at_partitions(pool: &sqlx::PgPool, now: chrono::DateTime<chrono::Utc>) {
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
fn start_retention(
    settings: &Settings,
    ledger: &Arc<dyn crate::engine::ledger::LedgerStore>,
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
