//! Wiring: stores, caches and the HTTP server, built the same way in production and tests.

mod counters;
mod embedded;
mod tasks;

use crate::access::Gate;
use crate::admission::{Admission, Limits};
use crate::api::extract::{problem_for_bare_errors, MAX_BODY_BYTES};
use crate::api::problem::ApiError;
use crate::api::{self, AppState};
use crate::clock::{Clock, SystemClock};
use crate::config::{Secret, Settings};
use crate::engine::janitor::Janitor;
use crate::engine::ledger::LedgerStore;
use crate::engine::load::Load;
use crate::engine::pipeline::lag::Lag;
use crate::engine::pipeline::writer::LedgerWriter;
use crate::engine::state::ScratchStore;
use crate::engine::{Engine, Ports, Restored};
use crate::ledger::retention::RetentionTask;
use crate::metrics::Metrics;
use crate::policy::{self, Caches, PolicyStore, Refresher};
use actix_web::middleware::{from_fn, ErrorHandlers};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use counters::{counter_store, scratch_store, Counters};
use std::net::TcpListener;
use std::sync::Arc;
use tasks::BackgroundTasks;
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

/// The admin token in force, and whether it was generated (and should be shown).
fn admin_token(settings: &Settings) -> (Secret, bool) {
    match settings.admin_token.clone() {
        Some(token) => (token, false),
        None => (random_token(), true),
    }
}

/// A fresh random token, as hex: two v4 UUIDs, 244 random bits from rand's thread-local
/// generator (a CSPRNG seeded by the operating system; uuid's `fast-rng` feature).
fn random_token() -> Secret {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    Secret::new(format!("{a}{b}"))
}

/// The stores of the ledger's database (SQLite or Postgres), connected, migrated and
/// upgraded, and the policy and key caches loaded from it.
struct Stores {
    /// The pool that announces this instance in `service_instances` (and, on Postgres,
    /// looks after the ledger's partitions).
    announcements: crate::db::Pool,
    policies: Arc<dyn PolicyStore>,
    ledger: Arc<dyn LedgerStore>,
    caches: Caches,
}

impl Stores {
    /// Connects once first, so that a refused certificate stops the start.
    async fn open(url: &str) -> anyhow::Result<Self> {
        crate::db::check_connection(url).await?;
        crate::db::migrate_url(url).await?;
        crate::ledger::upgrade::upgrade_url(url).await?;
        let announcements = crate::db::open_with(url, 1, &[]).await?;
        let policies = policy::connect(url).await?;
        let ledger = crate::ledger::sql::connect(url).await?;
        let caches = Caches::new();
        policy::reload(&caches, policies.as_ref())
            .await
            .context("loading policies and API keys into the caches")?;
        Ok(Self {
            announcements,
            policies,
            ledger,
            caches,
        })
    }
}

/// The engine on its ports, its counters rebuilt before the first request: the ledger is
/// the book of record, the counters its cache. In process, from the last snapshot and the
/// ledger; on Redis, the shards without an epoch (a first start, or Redis lost its data)
/// now if Redis answers, else the watch does it as soon as it does.
async fn start_engine(
    settings: &Settings,
    counters: Counters,
    ledger: Arc<dyn LedgerStore>,
    caches: &Caches,
    clock: Arc<dyn Clock>,
    janitor: Arc<Janitor>,
    (load, lag): (&Arc<Load>, &Arc<Lag>),
) -> anyhow::Result<(Engine, Option<Restored>)> {
    let ports = Ports {
        counters: counters.store,
        writer: LedgerWriter::spawn_recording(ledger.clone(), lag.clone()),
        ledger,
        cache: caches.policies.clone(),
        clock,
        load: load.clone(),
        durability: counters.durability,
        scratch: Arc::new(scratch_store) as ScratchStore,
        janitor,
    };
    let engine = Engine::new(
        ports,
        settings.redis_prefix.clone(),
        settings.on_store_error,
    );
    let restored = match &counters.embedded {
        Some(embedded) => Some(embedded.restore(&engine).await?),
        None => None,
    };
    engine.recovery().reopen_if_wanted(true).await;
    Ok((engine, restored))
}

/// The admission control of `/quota/*` requests, paced while the ledger drain lags.
fn admission(settings: &Settings, load: Arc<Load>, lag: &Arc<Lag>) -> Arc<Admission> {
    let limits = Limits {
        in_flight: settings.max_in_flight,
        queued: settings.max_queued,
        wait: settings.queue_wait,
    };
    Arc::new(Admission::new(limits, load).pacing(lag.clone(), settings.ledger_pace))
}

/// The HTTP server on `QUOTA_LISTEN`, and the port it took.
fn serve_http(
    settings: &Settings,
    state: web::Data<AppState>,
    gate: Arc<Gate>,
) -> anyhow::Result<(u16, actix_web::dev::Server)> {
    let listener = TcpListener::bind(settings.listen)
        .with_context(|| format!("binding {}", settings.listen))?;
    let port = listener
        .local_addr()
        .context("reading the bound address")?
        .port();
    Ok((port, http_server(listener, state, web::Data::from(gate))?))
}

/// Envoy's rate limit service on `QUOTA_GRPC_LISTEN`, when it is set.
fn serve_grpc(
    settings: &Settings,
    state: &web::Data<AppState>,
    gate: Arc<Gate>,
) -> anyhow::Result<Option<crate::grpc::GrpcServer>> {
    let Some(address) = settings.grpc_listen else {
        return Ok(None);
    };
    let limiter = crate::grpc::RateLimiter::new(
        state.engine.clone(),
        state.admission.clone(),
        state.metrics.clone(),
        gate,
    );
    let server = crate::grpc::GrpcServer::start(address, limiter)
        .with_context(|| format!("serving {address} (QUOTA_GRPC_LISTEN)"))?;
    tracing::info!(address = %server.address(), "serving Envoy's rate limit service (gRPC)");
    Ok(Some(server))
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
    /// time by the counter store. Each part is built by its own function, in the order
    /// they start: the database's stores, the access gate, the counters, the engine and
    /// its background work, then the servers.
    async fn build_on(
        settings: Settings,
        clock: Arc<dyn Clock>,
        time: Option<Arc<crate::clock::OffsetClock>>,
    ) -> anyhow::Result<Self> {
        crate::tls::install_provider();
        let stores = Stores::open(&settings.database_url).await?;
        let retention = tasks::start_retention(&settings, &stores.ledger, &clock, &stores.caches)?;
        let refresher = Refresher::start(
            stores.policies.clone(),
            stores.caches.clone(),
            settings.policy_poll,
        );
        let (admin_token, admin_token_generated) = admin_token(&settings);
        let gate = Arc::new(Gate::new(
            admin_token.clone(),
            settings.client_tokens.clone(),
            stores.caches.keys.clone(),
            clock.clone(),
        ));
        let mut tasks = BackgroundTasks::default();
        tasks.announce(stores.announcements, &clock).await;
        let load = Arc::new(Load::new());
        let ledger_lag = Arc::new(Lag::on(clock.clone()));
        let counters =
            counter_store(&settings, &stores.ledger, &load, &ledger_lag, time.clone()).await?;
        let janitor = tasks.janitor(&settings, &counters).await;
        let (webhooks, webhook_counts) = tasks.webhooks(&settings, &clock, &janitor).await?;
        let embedded = counters.embedded.is_some();
        let (engine, restored) = start_engine(
            &settings,
            counters,
            stores.ledger.clone(),
            &stores.caches,
            clock,
            janitor,
            (&load, &ledger_lag),
        )
        .await?;
        let state = web::Data::new(AppState {
            engine: Arc::new(engine),
            admission: admission(&settings, load, &ledger_lag),
            ledger_lag,
            policies: stores.policies,
            caches: stores.caches,
            gate: gate.clone(),
            ledger_retention_days: settings.ledger_retention_days,
            webhooks,
            webhook_allow_private: settings.webhook_allow_private,
            webhook_counts,
            backtests: Arc::default(),
            time,
            max_clock_offset: settings.max_clock_offset,
            metrics: Arc::new(Metrics::new()),
        });
        tasks.periodic_work(&state, &settings).await;
        let sweeper = embedded::Sweeper::spawn(state.clone());
        let periodic = embedded.then(|| {
            let covered = restored.and_then(|r| r.snapshot_seq);
            embedded::Periodic::spawn(state.engine.clone(), covered, settings.snapshot_entries)
        });
        let (port, server) = serve_http(&settings, state.clone(), gate.clone())?;
        let grpc = serve_grpc(&settings, &state, gate)?;
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
