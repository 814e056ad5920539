//! Spawning the real application on port 0 with fresh stores, and typed request helpers.

use chrono::{DateTime, TimeZone, Utc};
use quota_ledger::clock::FakeClock;
use quota_ledger::config::{OnStoreError, Secret, Settings};
use quota_ledger::startup::Application;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sqlx::Connection;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod binary;
mod certs;
mod keyed_load;
mod private_postgres;
mod private_redis;
pub use binary::{create_sms_policy, start_binary, start_binary_at, Service};
pub use certs::TestCerts;
pub use keyed_load::{keyed_consume, KeyedLoad};
pub use private_postgres::{pg_dump, PrivatePostgres};
pub use private_redis::PrivateRedis;

/// Which policy store an app uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyBackend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh database on the test Postgres server.
    Postgres,
}

/// Which counter store an app uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterBackend {
    /// In-process counters.
    Memory,
    /// The test Redis, under a unique key prefix.
    Redis,
    /// The test Redis Cluster (3 masters), under a unique key prefix.
    Cluster,
}

/// The admin token every test app uses.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// The instant fake clocks start at: Saturday 2026-11-21 12:00:00 UTC.
pub fn start_instant() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
        .single()
        .expect("valid instant")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test.sh, which starts Redis and Postgres")
    })
}

/// The nodes of the test Redis Cluster (`QUOTA_TEST_REDIS_CLUSTER_URLS`, comma-separated).
pub fn cluster_urls() -> Vec<String> {
    let urls: Vec<String> = std::env::var("QUOTA_TEST_REDIS_CLUSTER_URLS")
        .unwrap_or_else(|_| {
            panic!(
                "QUOTA_TEST_REDIS_CLUSTER_URLS is not set: run the tests with scripts/test.sh \
                 (scripts/with-stores.sh starts a 3-master Redis Cluster unless WITH_STORES_CLUSTER=0)"
            )
        })
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        !urls.is_empty(),
        "QUOTA_TEST_REDIS_CLUSTER_URLS lists no node"
    );
    urls
}

/// A loopback port that was free a moment ago (the system picked it for a listener that is
/// closed at once): for a server the test starts on it, or an address where nothing listens.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port()
}

/// How long [`eventually`] pauses between two looks.
const POLL_PAUSE: Duration = Duration::from_millis(10);

/// Waits for something the test cannot drive itself (another process, another instance,
/// a server coming back): calls `f` until it returns `Some`, pausing briefly between calls,
/// and returns the value; panics naming `what` once `timeout` has passed without it.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = f().await {
            return value;
        }
        assert!(
            started.elapsed() < timeout,
            "not within {timeout:?}: {what}"
        );
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// A running application and what a test needs to talk to it.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`.
    pub address: String,
    /// `http://127.0.0.1:PORT` of Envoy's rate limit service (gRPC), if served.
    pub grpc: Option<String>,
    /// A client with sane timeouts.
    pub client: reqwest::Client,
    /// The app's clock.
    pub clock: Arc<FakeClock>,
    /// The settings it was built with (to start a sibling instance).
    pub settings: Settings,
    /// The app's engine, to run background work (hold expiry, the drain) when a test says.
    pub engine: Arc<quota_ledger::engine::Engine>,
    /// The app's admission control (how many quota requests are in flight).
    pub admission: Arc<quota_ledger::admission::Admission>,
    /// How its start rebuilt the in-process counters (`None` on Redis).
    pub restored: Option<quota_ledger::engine::Restored>,
    handle: actix_web::dev::ServerHandle,
    /// The task serving it (and saving its snapshot once stopped), until a restart takes it.
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// The fresh SQLite database this app owns, if it does; its server task holds it too.
    /// Declared last, so that it goes after everything else the app holds.
    database: Option<Arc<SqliteFiles>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // The server stops in its own task, which holds the database too: the files are
        // deleted once this app is gone and the server has stopped (or the runtime ended).
        drop(self.handle.stop(false));
    }
}

/// A fresh SQLite database in the temp dir: the file and the `-wal`, `-shm` and `-journal`
/// files SQLite makes beside it, deleted when dropped (errors ignored: a test that pointed
/// its app elsewhere never created them).
#[derive(Debug)]
struct SqliteFiles(PathBuf);

impl Drop for SqliteFiles {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Settings for a fresh app, and the ownership of the fresh SQLite database they name (none
/// on Postgres): the app spawned with them deletes it once stopped. They read and change as
/// [`Settings`]. A clone of those (`fresh.clone()`, `app.settings.clone()`) owns nothing: an
/// instance spawned with it shares the database and leaves it to the owner.
#[derive(Debug)]
pub struct FreshSettings {
    settings: Settings,
    database: Option<SqliteFiles>,
}

impl Deref for FreshSettings {
    type Target = Settings;

    fn deref(&self) -> &Settings {
        &self.settings
    }
}

impl DerefMut for FreshSettings {
    fn deref_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl From<Settings> for FreshSettings {
    /// Settings of another app's database: owning nothing.
    fn from(settings: Settings) -> Self {
        Self {
            settings,
            database: None,
        }
    }
}

/// A fresh database's URL, and for SQLite its files to delete.
async fn fresh_database(policy: PolicyBackend) -> (String, Option<SqliteFiles>) {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    match policy {
        PolicyBackend::Sqlite => {
            let path = std::env::temp_dir().join(format!("quota-ledger-{name}.db"));
            let url = format!("sqlite://{}", path.display());
            (url, Some(SqliteFiles(path)))
        }
        PolicyBackend::Postgres => {
            let admin_url = env("QUOTA_TEST_DATABASE_URL");
            let mut conn = sqlx::PgConnection::connect(&admin_url)
                .await
                .expect("connecting to the test Postgres");
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut conn)
                .await
                .expect("creating a test database");
            let base = admin_url
                .rsplit_once('/')
                .map_or(admin_url.as_str(), |(b, _)| b);
            (format!("{base}/{name}"), None)
        }
    }
}

/// Settings for a fresh app on port 0 with fresh stores.
pub async fn fresh_settings(policy: PolicyBackend, counters: CounterBackend) -> FreshSettings {
    let (database_url, database) = fresh_database(policy).await;
    let settings = Settings {
        listen: "127.0.0.1:0".parse().expect("valid address"),
        grpc_listen: Some("127.0.0.1:0".parse().expect("valid address")),
        database_url,
        redis_urls: match counters {
            CounterBackend::Memory => Vec::new(),
            CounterBackend::Redis => vec![env("QUOTA_TEST_REDIS_URL")],
            CounterBackend::Cluster => cluster_urls(),
        },
        redis_cluster: counters == CounterBackend::Cluster,
        redis_sentinel: None,
        redis_tls: quota_ledger::config::RedisTlsFiles::default(),
        redis_allow_eviction: false,
        // The tests' webhook receivers listen on 127.0.0.1.
        webhook_allow_private: true,
        redis_prefix: format!("t{}", uuid::Uuid::new_v4().simple()),
        redis_timeout: Duration::from_millis(2_000),
        max_clock_offset: Duration::from_millis(1_000),
        redis_min_replicas: 0,
        admin_token: Some(Secret::new(ADMIN_TOKEN)),
        client_tokens: Vec::new(),
        on_store_error: OnStoreError::Deny,
        log_json: false,
        ledger_retention_days: Some(400),
        ledger_claim_idle: Duration::from_millis(1_000),
        policy_poll: Duration::from_millis(500),
        // Above the bursts of the concurrency tests: they test exact limits, not shedding.
        max_in_flight: 1_024,
        max_queued: 4_096,
        queue_wait: Duration::from_millis(250),
        ledger_backlog_max: 1_000_000,
        ledger_pace: Duration::from_millis(500),
        // Tests verify when they say (GET /admin/counters/verify).
        verify_interval: None,
        snapshot_entries: 200_000,
        checkpoint_every: Some(Duration::from_secs(5)),
    };
    FreshSettings { settings, database }
}

/// Starts an app with fresh stores and a fake clock at [`start_instant`].
pub async fn spawn_app(policy: PolicyBackend, counters: CounterBackend) -> TestApp {
    spawn_with(fresh_settings(policy, counters).await).await
}

/// Starts an app on a fresh SQLite policy store and `counters`, with `policies` created.
pub async fn app_with(counters: CounterBackend, policies: &[Value]) -> TestApp {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    for policy in policies {
        app.must_create_policy(policy.clone()).await;
    }
    app
}

/// Starts an app with the given settings and a fake clock at [`start_instant`]. With
/// [`FreshSettings`] the app owns their fresh database; with a copy of another app's
/// [`Settings`] it is a sibling instance on that app's database.
pub async fn spawn_with(settings: impl Into<FreshSettings>) -> TestApp {
    let FreshSettings { settings, database } = settings.into();
    let clock = Arc::new(FakeClock::new(start_instant()));
    spawn_owning(settings, database.map(Arc::new), clock).await
}

/// Starts an app that keeps `database` (if any) until it and its server have stopped.
async fn spawn_owning(
    settings: Settings,
    database: Option<Arc<SqliteFiles>>,
    clock: Arc<FakeClock>,
) -> TestApp {
    let app = Application::build_with_clock(settings.clone(), clock.clone())
        .await
        .expect("building the app");
    let address = format!("http://127.0.0.1:{}", app.port());
    let grpc = app
        .grpc_port()
        .map(|port| format!("http://127.0.0.1:{port}"));
    let handle = app.handle();
    let engine = app.engine();
    let admission = app.admission();
    let restored = app.restored();
    let server_database = database.clone();
    let served = tokio::spawn(async move {
        let served = app.run_until_stopped().await;
        drop(server_database);
        served
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("building a client");
    TestApp {
        address,
        grpc,
        client,
        clock,
        settings,
        engine,
        admission,
        restored,
        handle,
        served: Some(served),
        database,
    }
}

/// A response read whole: status, headers and JSON body (Null when empty).
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as JSON.
    pub body: Value,
}

impl Answer {
    /// Reads a response.
    pub async fn read(response: Response) -> Self {
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("reading the body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("body is not JSON: {text}"))
        };
        Self {
            status,
            headers,
            body,
        }
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The fields a 422 names, in order.
    pub fn problem_fields(&self) -> Vec<&str> {
        self.body["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["field"].as_str())
            .collect()
    }

    /// Asserts an RFC 9457 problem with this status and returns the body.
    pub fn assert_problem(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "errors are problem+json"
        );
        assert_eq!(self.body["status"], status);
        assert!(self.body["type"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(self.body["title"].is_string());
        assert!(self.body["detail"].is_string());
        &self.body
    }
}

impl TestApp {
    /// Stops this instance gracefully (as SIGTERM does: the server stops, then the
    /// in-process counters are snapshotted) and starts a new one on the same settings and
    /// stores; the new instance takes over the database this one owned.
    pub async fn restart(self) -> TestApp {
        self.restart_at(|| {}).await
    }

    /// [`TestApp::restart`], running `meanwhile` (say, advancing the clock) while no
    /// instance runs. The new instance keeps this one's clock.
    pub async fn restart_at(mut self, meanwhile: impl FnOnce()) -> TestApp {
        // Idle keep-alive connections would hold the graceful stop for its whole grace.
        self.client = reqwest::Client::new();
        self.handle.stop(true).await;
        if let Some(served) = self.served.take() {
            served
                .await
                .expect("the server task ends")
                .expect("the server stops cleanly");
        }
        self.start_again(meanwhile).await
    }

    /// Kills this instance as kill -9 would (no snapshot is taken: its serving task is
    /// dropped where it waits for the server) and starts a new one on the same stores.
    pub async fn crash_restart(mut self) -> TestApp {
        if let Some(served) = self.served.take() {
            served.abort();
            let _ = served.await;
        }
        self.handle.stop(false).await;
        self.start_again(|| {}).await
    }

    /// Stops this instance gracefully and tries to start another on its stores with
    /// `change`d settings, which must fail: the error, with its causes.
    pub async fn restart_refused(mut self, change: impl FnOnce(&mut Settings)) -> String {
        self.client = reqwest::Client::new();
        self.handle.stop(true).await;
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
        let mut settings = self.settings.clone();
        change(&mut settings);
        let (database, clock) = (self.database.clone(), self.clock.clone());
        drop(self);
        let refused = Application::build_with_clock(settings, clock).await.err();
        drop(database);
        format!("{:#}", refused.expect("the new instance refuses to start"))
    }

    /// Drops this instance, runs `meanwhile`, and starts another on its stores and clock.
    async fn start_again(self, meanwhile: impl FnOnce()) -> TestApp {
        let settings = self.settings.clone();
        let database = self.database.clone();
        let clock = self.clock.clone();
        drop(self);
        meanwhile();
        spawn_owning(settings, database, clock).await
    }

    /// A request builder with the admin token.
    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.address))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// Sends a request and reads the answer.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        Answer::read(request.send().await.expect("sending the request")).await
    }

    /// `POST /admin/policies`.
    pub async fn create_policy(&self, policy: Value) -> Answer {
        self.send(
            self.admin(reqwest::Method::POST, "/admin/policies")
                .json(&policy),
        )
        .await
    }

    /// Creates a policy and asserts 201.
    pub async fn must_create_policy(&self, policy: Value) -> Value {
        let answer = self.create_policy(policy).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body
    }

    /// `GET` with the admin token.
    pub async fn admin_get(&self, path: &str) -> Answer {
        self.send(self.admin(reqwest::Method::GET, path)).await
    }

    /// The OpenAPI document the app serves at `/api-docs/openapi.json`.
    pub async fn served_spec(&self) -> Value {
        self.client
            .get(format!("{}/api-docs/openapi.json", self.address))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `POST /quota/consume`.
    pub async fn consume(&self, action: &str, subject: &str, amount: u64) -> Answer {
        self.quota(
            "/quota/consume",
            json!({"action": action, "subject": subject, "amount": amount}),
        )
        .await
    }

    /// `POST /quota/check`.
    pub async fn check(&self, action: &str, subject: &str, amount: u64) -> Answer {
        self.quota(
            "/quota/check",
            json!({"action": action, "subject": subject, "amount": amount}),
        )
        .await
    }

    /// `POST` a JSON body to a quota endpoint.
    pub async fn quota(&self, path: &str, body: Value) -> Answer {
        self.send(
            self.client
                .post(format!("{}{path}", self.address))
                .json(&body),
        )
        .await
    }

    /// `GET /quota/usage`.
    pub async fn usage(&self, action: &str, subject: &str) -> Answer {
        self.send(
            self.client
                .get(format!("{}/quota/usage", self.address))
                .query(&[("action", action), ("subject", subject)]),
        )
        .await
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.address))
            .send()
            .await
            .expect("scraping /metrics");
        response.text().await.expect("the metrics' text")
    }

    /// Moves the fake clock forward.
    pub fn advance(&self, seconds: i64) {
        self.clock.advance(chrono::Duration::seconds(seconds));
    }
}

/// A calendar policy body.
pub fn calendar_policy(id: &str, action: &str, limit: u64, period: &str, timezone: &str) -> Value {
    json!({"id": id, "action": action, "measure": "count", "limit": limit,
           "window": {"type": "calendar", "period": period, "timezone": timezone}})
}

/// Runs one async scenario against every policy store.
#[macro_export]
macro_rules! on_policy_stores {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $( #[tokio::test] async fn $name() { super::$name($crate::helpers::PolicyBackend::Sqlite).await } )*
        }
        mod on_postgres {
            $( #[tokio::test] async fn $name() { super::$name($crate::helpers::PolicyBackend::Postgres).await } )*
        }
    };
}

/// `quota-ledger ARGS` against `app` (its URL and admin token in the environment):
/// exit status, stdout, stderr. Run off the test's runtime, which serves the app meanwhile.
pub async fn cli(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"));
    command
        .args(args)
        .env("QUOTA_URL", &app.address)
        .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("DATABASE_URL", "sqlite::memory:")
        .env_remove("REDIS_URL");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the command's task")
        .expect("running the binary");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs one async scenario against every counter store.
#[macro_export]
macro_rules! on_counter_stores {
    ($($name:ident),* $(,)?) => {
        mod on_memory {
            $( #[tokio::test] async fn $name() { super::$name($crate::helpers::CounterBackend::Memory).await } )*
        }
        mod on_redis {
            $( #[tokio::test] async fn $name() { super::$name($crate::helpers::CounterBackend::Redis).await } )*
        }
        mod on_cluster {
            $( #[tokio::test] async fn $name() { super::$name($crate::helpers::CounterBackend::Cluster).await } )*
        }
    };
}
