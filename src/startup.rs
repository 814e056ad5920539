//! Wiring: stores, caches and the HTTP server, built the same way in production and tests.

use crate::api::extract::{problem_for_bare_errors, Tokens, MAX_BODY_BYTES};
use crate::api::problem::ApiError;
use crate::api::{self, AppState};
use crate::config::{Secret, Settings};
use crate::engine::clock::{Clock, SystemClock};
use crate::engine::store::memory::MemoryCounterStore;
use crate::engine::store::redis::RedisCounterStore;
use crate::engine::store::CounterStore;
use crate::engine::Engine;
use crate::policy::{self, PolicyCache};
use actix_web::middleware::ErrorHandlers;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use std::net::TcpListener;
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_actix_web::AppExt;
use utoipa_swagger_ui::SwaggerUi;

/// A built service, bound to its port and ready to run.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    admin_token: Secret,
    admin_token_generated: bool,
}

/// A fresh random token: 256 bits from the operating system's generator, as hex.
fn random_token() -> Secret {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    Secret::new(format!("{a}{b}"))
}

impl Application {
    /// Builds the service on the system clock.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with_clock(settings, Arc::new(SystemClock)).await
    }

    /// Builds the service with an explicit time source (tests use a fake clock).
    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let policies = policy::connect(&settings.database_url).await?;
        policies
            .migrate()
            .await
            .context("applying the policy store's migrations")?;
        let cache = Arc::new(PolicyCache::new());
        cache
            .reload(policies.as_ref())
            .await
            .context("loading policies into the cache")?;
        let embedded_counters = settings.redis_urls.is_empty();
        let counters: Arc<dyn CounterStore> = if embedded_counters {
            Arc::new(MemoryCounterStore::new())
        } else {
            let store = RedisCounterStore::connect(
                &settings.redis_urls,
                settings.redis_cluster,
                settings.redis_timeout,
            )
            .await
            .context("connecting to Redis (REDIS_URL)")?;
            Arc::new(store)
        };
        let engine = Engine::new(
            counters,
            cache.clone(),
            clock.clone(),
            settings.redis_prefix.clone(),
            settings.on_store_error,
        );
        let state = web::Data::new(AppState {
            engine,
            policies,
            cache,
            clock,
            embedded_counters,
        });
        let admin_token_generated = settings.admin_token.is_none();
        let admin_token = settings.admin_token.clone().unwrap_or_else(random_token);
        let tokens = web::Data::new(Tokens {
            admin: admin_token.clone(),
            clients: settings.client_tokens.clone(),
        });
        let listener = TcpListener::bind(settings.listen)
            .with_context(|| format!("binding {}", settings.listen))?;
        let port = listener
            .local_addr()
            .context("reading the bound address")?
            .port();
        let spec = api::openapi::spec();
        let server = HttpServer::new(move || {
            let (app, _) = App::new()
                .into_utoipa_app()
                .openapi(api::openapi::ApiDoc::openapi())
                .configure(api::routes)
                .split_for_parts();
            app.app_data(state.clone())
                .app_data(tokens.clone())
                .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
                .app_data(web::QueryConfig::default().error_handler(|error, _| {
                    ApiError::Malformed(format!("invalid query string: {error}")).into()
                }))
                .app_data(web::PathConfig::default().error_handler(|error, _| {
                    ApiError::NotFound(format!("invalid path: {error}")).into()
                }))
                .service(
                    SwaggerUi::new("/swagger-ui/{_:.*}")
                        .url("/api-docs/openapi.json", spec.clone()),
                )
                .default_service(web::to(api::routing::unrouted))
                .wrap(ErrorHandlers::new().default_handler(problem_for_bare_errors))
        })
        .listen(listener)
        .context("starting the HTTP server")?
        .run();
        Ok(Self {
            port,
            server,
            admin_token,
            admin_token_generated,
        })
    }

    /// The port the service listens on (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin bearer token in force.
    pub fn admin_token(&self) -> &Secret {
        &self.admin_token
    }

    /// Whether the admin token was generated (and should be shown to the operator).
    pub fn admin_token_generated(&self) -> bool {
        self.admin_token_generated
    }

    /// Serves until the server is stopped (SIGINT/SIGTERM or a handle).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }

    /// A handle to stop the server from elsewhere.
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }
}
