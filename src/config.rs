//! Typed settings, read once from the environment (names as in the product contract) or
//! from the flags that mirror it.
//!
//! clap reads them ([`ConfigArgs`]) with a typed value parser each, so `quota-ledger --help`
//! lists every variable with its default and a bad value is refused at once, naming the
//! variable (for any command: the flags are global); [`Settings::from_args`] then checks
//! what spans several variables and builds [`Settings`].

use anyhow::bail;
#[cfg(test)]
use anyhow::Context;
use clap::{ArgAction, Args};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::engine::OnStoreError;

mod parse;
use parse::{
    grpc_address, list, non_blank, non_empty_path, on_store_error, parsed, prefix, retention_days,
    secret, sentinel, split_list, switch, text, whole, KeepDays, Listen, Urls,
};

/// A secret that never shows in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call only where it is compared or shown on purpose.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Every setting of the service. Its `Debug` output hides secrets: tokens, and the
/// password of a database or Redis URL.
#[derive(Clone)]
pub struct Settings {
    /// Address to serve on (`QUOTA_LISTEN`); port 0 picks a free one.
    pub listen: SocketAddr,
    /// Address of Envoy's rate limit service over gRPC (`QUOTA_GRPC_LISTEN`); `None`: none.
    pub grpc_listen: Option<SocketAddr>,
    /// Policy store (`DATABASE_URL`): `postgres://…` or `sqlite://…`.
    pub database_url: String,
    /// Counter store nodes (`REDIS_URL`, comma-separated); empty for in-process counters.
    pub redis_urls: Vec<String>,
    /// Whether `redis_urls` are Redis Cluster nodes (`REDIS_CLUSTER`).
    pub redis_cluster: bool,
    /// The primary found through Sentinel (`REDIS_SENTINELS`, `REDIS_SENTINEL_MASTER`);
    /// `redis_urls` then holds at most one URL, whose scheme, user, password and database
    /// are used to reach the primary (its host is not).
    pub redis_sentinel: Option<SentinelSettings>,
    /// Files for TLS to Redis (`rediss://`): a CA bundle instead of the system's roots,
    /// and a client certificate with its key.
    pub redis_tls: RedisTlsFiles,
    /// Serve on a Redis whose `maxmemory-policy` may evict keys
    /// (`QUOTA_REDIS_ALLOW_EVICTION`); refused by default.
    pub redis_allow_eviction: bool,
    /// Let webhooks point at loopback and private addresses
    /// (`QUOTA_WEBHOOK_ALLOW_PRIVATE`); refused by default.
    pub webhook_allow_private: bool,
    /// Prefix of every Redis key (`QUOTA_REDIS_PREFIX`), so several deployments can share one Redis.
    pub redis_prefix: String,
    /// Deadline of one Redis call (`QUOTA_REDIS_TIMEOUT_MS`).
    pub redis_timeout: Duration,
    /// Replicas that must acknowledge a decision that charged before it is answered
    /// (`QUOTA_REDIS_MIN_REPLICAS`); 0 answers at once.
    pub redis_min_replicas: u32,
    /// The offset of this machine's clock from Redis's past which the instance warns, once
    /// a minute, and names it in `/readyz` (`QUOTA_MAX_CLOCK_OFFSET_MS`).
    pub max_clock_offset: Duration,
    /// Bearer token for `/admin/*` (`QUOTA_ADMIN_TOKEN`); `None` generates one at start.
    pub admin_token: Option<Secret>,
    /// Bearer tokens for `/quota/*` (`QUOTA_CLIENT_TOKENS`); empty leaves them open.
    pub client_tokens: Vec<Secret>,
    /// Fail-closed or fail-open when Redis is down (`QUOTA_ON_STORE_ERROR`).
    pub on_store_error: OnStoreError,
    /// JSON log lines (`QUOTA_LOG_FORMAT=json`) instead of human-readable ones.
    pub log_json: bool,
    /// Days ledger entries are kept before the retention task deletes them
    /// (`QUOTA_LEDGER_RETENTION_DAYS`, at least 1); `None` keeps them for ever (`forever`,
    /// which `lifetime` windows need).
    pub ledger_retention_days: Option<u32>,
    /// How long a Redis ledger-stream entry may sit unacknowledged with a consumer before
    /// another instance's drain claims it (`QUOTA_LEDGER_CLAIM_IDLE_MS`, default 30 s).
    pub ledger_claim_idle: Duration,
    /// How often the policy store's change marker is polled (`QUOTA_POLICY_POLL_MS`), so a
    /// change made through another instance is enforced here within about this long.
    pub policy_poll: Duration,
    /// The most `/quota/*` requests served at once (`QUOTA_MAX_IN_FLIGHT`, at least 1).
    pub max_in_flight: usize,
    /// The most `/quota/*` requests waiting for a slot (`QUOTA_MAX_QUEUED`); past it, the
    /// oldest waiter is answered 503 overloaded. 0 answers the excess at once.
    pub max_queued: usize,
    /// The longest a request waits for a slot before it is answered 503 overloaded
    /// (`QUOTA_QUEUE_WAIT_MS`).
    pub queue_wait: Duration,
    /// The most ledger entries that may wait in the Redis streams, all shards together
    /// (`QUOTA_LEDGER_BACKLOG_MAX`, at least 1): past it, consumes are answered 503 until the
    /// drain catches up, so a Postgres outage cannot fill Redis.
    pub ledger_backlog_max: u64,
    /// While the ledger drain's latest commit carried an entry older than this, `/quota/*`
    /// requests wait a millisecond before they are served, so that the drain keeps up
    /// (`QUOTA_LEDGER_PACE_MS`; zero never paces).
    pub ledger_pace: Duration,
    /// How often the service compares its counters with the ledger in the background
    /// (`QUOTA_VERIFY_INTERVAL_S`); `None`: never.
    pub verify_interval: Option<Duration>,
    /// Embedded default: a running service snapshots its counters once this many ledger
    /// entries were committed after the last snapshot, besides every 5 minutes, so that a
    /// start after kill -9 replays at most about this many (`QUOTA_SNAPSHOT_ENTRIES`;
    /// zero: every 5 minutes only).
    pub snapshot_entries: u64,
    /// Redis mode: how often the janitor checkpoints the ledger's replay, so that a rebuild
    /// after Redis lost its data replays only the entries after it
    /// (`QUOTA_CHECKPOINT_EVERY_S`, 10 s by default); `None`: never, a rebuild replays the
    /// whole horizon.
    pub checkpoint_every: Option<Duration>,
}

/// Where the sentinels are and which primary to ask them for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// `host:port` of each sentinel (`REDIS_SENTINELS`).
    pub sentinels: Vec<String>,
    /// The name the sentinels know the primary by (`REDIS_SENTINEL_MASTER`).
    pub master: String,
}

/// PEM files for TLS to Redis; each unset means the default (the system's roots, no
/// client certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsFiles {
    /// CA certificates that verify the server (`QUOTA_REDIS_CA_FILE`).
    pub ca_file: Option<PathBuf>,
    /// The client certificate (`QUOTA_REDIS_CERT_FILE`); set with `key_file` or not at all.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (`QUOTA_REDIS_KEY_FILE`).
    pub key_file: Option<PathBuf>,
}

impl Settings {
    /// Whether the counters live in Redis (a URL, or sentinels to find the primary).
    pub fn uses_redis(&self) -> bool {
        !self.redis_urls.is_empty() || self.redis_sentinel.is_some()
    }
}

/// `url` with the password of its userinfo (`scheme://user:password@host`) masked.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let masked = if user.len() < userinfo.len() {
                ":***"
            } else {
                ""
            };
            format!("{scheme}://{user}{masked}@{host}{}", &rest[authority_end..])
        }
        None => url.to_owned(),
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redis: Vec<String> = self
            .redis_urls
            .iter()
            .map(|u| without_password(u))
            .collect();
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("grpc_listen", &self.grpc_listen)
            .field("database_url", &without_password(&self.database_url))
            .field("redis_urls", &redis)
            .field("redis_cluster", &self.redis_cluster)
            .field("redis_sentinel", &self.redis_sentinel)
            .field("redis_tls", &self.redis_tls)
            .field("redis_allow_eviction", &self.redis_allow_eviction)
            .field("webhook_allow_private", &self.webhook_allow_private)
            .field("redis_prefix", &self.redis_prefix)
            .field("redis_timeout", &self.redis_timeout)
            .field("max_clock_offset", &self.max_clock_offset)
            .field("redis_min_replicas", &self.redis_min_replicas)
            .field("admin_token", &self.admin_token)
            .field("client_tokens", &self.client_tokens)
            .field("on_store_error", &self.on_store_error)
            .field("log_json", &self.log_json)
            .field("ledger_retention_days", &self.ledger_retention_days)
            .field("ledger_claim_idle", &self.ledger_claim_idle)
            .field("policy_poll", &self.policy_poll)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_queued", &self.max_queued)
            .field("queue_wait", &self.queue_wait)
            .field("ledger_backlog_max", &self.ledger_backlog_max)
            .field("ledger_pace", &self.ledger_pace)
            .field("verify_interval", &self.verify_interval)
            .field("snapshot_entries", &self.snapshot_entries)
            .field("checkpoint_every", &self.checkpoint_every)
            .finish()
    }
}

/// The variables read outside the configuration's flags (by the logger and the trace
/// exporter), told after `--help`.
pub const READ_ELSEWHERE_HELP: &str = "Also read: RUST_LOG filters log lines (tracing \
    EnvFilter syntax; default: info). OTEL_EXPORTER_OTLP_ENDPOINT (or \
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) exports traces over OTLP/HTTP; OTEL_SERVICE_NAME \
    names the service in them (default: quota-ledger).";

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_DATABASE_URL: &str = "sqlite://quota-ledger.db";
const DEFAULT_REDIS_CLUSTER: &str = "false";
const DEFAULT_REDIS_ALLOW_EVICTION: &str = "false";
const DEFAULT_REDIS_PREFIX: &str = "ql";
const DEFAULT_REDIS_TIMEOUT_MS: &str = "50";
const DEFAULT_MAX_CLOCK_OFFSET_MS: &str = "1000";
const DEFAULT_ON_STORE_ERROR: &str = "deny";
const DEFAULT_LOG_FORMAT: &str = "text";
const DEFAULT_LEDGER_RETENTION_DAYS: &str = "400";
const DEFAULT_LEDGER_CLAIM_IDLE_MS: &str = "30000";
const DEFAULT_POLICY_POLL_MS: &str = "500";
const DEFAULT_MAX_IN_FLIGHT: &str = "128";
const DEFAULT_MAX_QUEUED: &str = "4096";
const DEFAULT_QUEUE_WAIT_MS: &str = "1000";
const DEFAULT_LEDGER_BACKLOG_MAX: &str = "1000000";
const DEFAULT_LEDGER_PACE_MS: &str = "500";
/// An hour: a verify replays the ledger's horizon into memory (about a second per
/// million entries), which is worth doing often enough to see drift the same day, and
/// rarely enough to cost nothing noticeable.
const DEFAULT_VERIFY_INTERVAL_S: &str = "3600";
const DEFAULT_SNAPSHOT_ENTRIES: &str = "200000";
/// Ten seconds: a rebuild after Redis lost its data then replays about ten seconds of
/// entries after the checkpoint (a few seconds at full load), and the checkpoint's own
/// work (replaying every entry once more, saving the state) is spread thin.
const DEFAULT_CHECKPOINT_EVERY_S: &str = "10";

/// The configuration as given: each variable (or flag) parsed by its own value parser,
/// defaults filled in; an empty or blank value counts as unset. A bad value stops the
/// command with clap's error, which names the flag and says what the variable must be.
/// [`Settings::from_args`] then checks what spans several variables.
///
/// Its arguments are global: they may follow any subcommand (`quota-ledger serve --help`
/// lists them too). Values that may hold a secret (tokens, and URLs with a password) are
/// never shown by `--help`, and tokens never by `Debug`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Configuration (environment variables, or these flags)")]
pub struct ConfigArgs {
    /// Address to serve on; port 0 picks a free one.
    #[arg(long, env = "QUOTA_LISTEN", value_name = "ADDR", default_value = DEFAULT_LISTEN,
        value_parser = parsed::<SocketAddr>(DEFAULT_LISTEN, "QUOTA_LISTEN", "an address such as 127.0.0.1:8080"),
        global = true)]
    listen: SocketAddr,
    /// Policies and ledger: postgres://… in production, sqlite://FILE embedded.
    #[arg(long, env = "DATABASE_URL", value_name = "URL", default_value = DEFAULT_DATABASE_URL,
        value_parser = text(DEFAULT_DATABASE_URL), hide_env_values = true, global = true)]
    database_url: String,
    /// Counter store: redis://…, or with --redis-cluster a comma-separated list of the
    /// cluster's nodes. Unset: in-process counters.
    #[arg(long, env = "REDIS_URL", value_name = "URLS", value_parser = list,
        hide_env_values = true, global = true)]
    redis_url: Option<Urls>,
    /// Address of Envoy's rate limit service (gRPC ShouldRateLimit, and the gRPC health
    /// service); port 0 picks a free one. Unset: no gRPC.
    #[arg(long, env = "QUOTA_GRPC_LISTEN", value_name = "ADDR", value_parser = grpc_address,
        global = true)]
    grpc_listen: Option<Listen>,
    /// true when REDIS_URL lists Redis Cluster nodes (true, false, 1 or 0).
    #[arg(long, env = "REDIS_CLUSTER", value_name = "BOOL", default_value = DEFAULT_REDIS_CLUSTER,
        value_parser = switch(DEFAULT_REDIS_CLUSTER, "REDIS_CLUSTER"), action = ArgAction::Set,
        global = true)]
    redis_cluster: bool,
    /// Comma-separated host:port of Redis Sentinels that name the primary (with
    /// REDIS_SENTINEL_MASTER); REDIS_URL, if set, then gives only the scheme, user,
    /// password and database of the primary.
    #[arg(long, env = "REDIS_SENTINELS", value_name = "ADDRS", value_parser = list,
        global = true)]
    redis_sentinels: Option<Urls>,
    /// The name the sentinels know the primary by.
    #[arg(
        long,
        env = "REDIS_SENTINEL_MASTER",
        value_name = "NAME",
        global = true
    )]
    redis_sentinel_master: Option<String>,
    /// PEM file of the CA certificates that verify Redis over TLS (rediss://).
    /// Unset: the system's roots.
    #[arg(long, env = "QUOTA_REDIS_CA_FILE", value_name = "FILE", global = true)]
    redis_ca_file: Option<PathBuf>,
    /// PEM file of a client certificate for TLS to Redis (with QUOTA_REDIS_KEY_FILE).
    #[arg(
        long,
        env = "QUOTA_REDIS_CERT_FILE",
        value_name = "FILE",
        global = true
    )]
    redis_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, env = "QUOTA_REDIS_KEY_FILE", value_name = "FILE", global = true)]
    redis_key_file: Option<PathBuf>,
    /// Serve on a Redis whose maxmemory-policy may evict keys (counters, idempotency
    /// records, holds, undrained ledger entries), accepting that risk; refused by default.
    #[arg(long, env = "QUOTA_REDIS_ALLOW_EVICTION", value_name = "BOOL",
        default_value = DEFAULT_REDIS_ALLOW_EVICTION,
        value_parser = switch(DEFAULT_REDIS_ALLOW_EVICTION, "QUOTA_REDIS_ALLOW_EVICTION"),
        action = ArgAction::Set, global = true)]
    redis_allow_eviction: bool,
    /// Let webhook endpoints resolve to loopback, private and link-local addresses
    /// (refused by default: a webhook must not reach into the service's own network).
    #[arg(long, env = "QUOTA_WEBHOOK_ALLOW_PRIVATE", value_name = "BOOL",
        default_value = "false",
        value_parser = switch("false", "QUOTA_WEBHOOK_ALLOW_PRIVATE"),
        action = ArgAction::Set, global = true)]
    webhook_allow_private: bool,
    /// Prefix of every Redis key, so several deployments can share one Redis; no { or }.
    #[arg(long, env = "QUOTA_REDIS_PREFIX", value_name = "PREFIX",
        default_value = DEFAULT_REDIS_PREFIX, value_parser = prefix, global = true)]
    redis_prefix: String,
    /// Deadline of one Redis call, connection included, in milliseconds.
    #[arg(long, env = "QUOTA_REDIS_TIMEOUT_MS", value_name = "MS",
        default_value = DEFAULT_REDIS_TIMEOUT_MS,
        value_parser = whole::<u64>(DEFAULT_REDIS_TIMEOUT_MS, "QUOTA_REDIS_TIMEOUT_MS", "milliseconds", 0),
        global = true)]
    redis_timeout_ms: u64,
    /// With Redis, decisions follow Redis's clock; past this offset of the machine's
    /// clock from it (milliseconds) the instance warns once a minute and says so in /readyz.
    #[arg(long, env = "QUOTA_MAX_CLOCK_OFFSET_MS", value_name = "MS",
        default_value = DEFAULT_MAX_CLOCK_OFFSET_MS,
        value_parser = whole::<u64>(DEFAULT_MAX_CLOCK_OFFSET_MS, "QUOTA_MAX_CLOCK_OFFSET_MS", "milliseconds", 0),
        global = true)]
    max_clock_offset_ms: u64,
    /// Replicas that must acknowledge (WAIT) a consume or hold that charged before it is
    /// answered; fewer in time answer 503 and give the charge back. Standalone Redis or
    /// Sentinel.
    #[arg(long, env = "QUOTA_REDIS_MIN_REPLICAS", value_name = "N", default_value = "0",
        value_parser = whole::<u32>("0", "QUOTA_REDIS_MIN_REPLICAS", "replicas", 0),
        global = true)]
    redis_min_replicas: u32,
    /// Bearer token for /admin/* (prefer the variable: flags show in the process list).
    /// Unset: a random token is generated and printed at start.
    #[arg(long, env = "QUOTA_ADMIN_TOKEN", value_name = "TOKEN", value_parser = secret,
        hide_env_values = true, global = true)]
    admin_token: Option<Secret>,
    /// Comma-separated bearer tokens for /quota/* (prefer the variable: flags show in the
    /// process list). Unset: the quota endpoints are open.
    #[arg(long, env = "QUOTA_CLIENT_TOKENS", value_name = "TOKENS", value_parser = secret,
        hide_env_values = true, global = true)]
    client_tokens: Option<Secret>,
    /// When Redis is unreachable: deny answers 503 (fail closed), allow answers allowed
    /// with "degraded": true (fail open).
    #[arg(long, env = "QUOTA_ON_STORE_ERROR", value_name = "deny|allow",
        default_value = DEFAULT_ON_STORE_ERROR, value_parser = on_store_error, global = true)]
    on_store_error: OnStoreError,
    /// json for one JSON object per log line; anything else is human-readable text.
    #[arg(long, env = "QUOTA_LOG_FORMAT", value_name = "FORMAT",
        default_value = DEFAULT_LOG_FORMAT, global = true)]
    log_format: String,
    /// Days ledger entries are kept (at least 1), or `forever` (which `lifetime` windows need).
    #[arg(long, env = "QUOTA_LEDGER_RETENTION_DAYS", value_name = "DAYS",
        default_value = DEFAULT_LEDGER_RETENTION_DAYS,
        value_parser = retention_days,
        global = true)]
    ledger_retention_days: KeepDays,
    /// How long a drained but unacknowledged ledger entry waits before another instance
    /// claims it, in milliseconds.
    #[arg(long, env = "QUOTA_LEDGER_CLAIM_IDLE_MS", value_name = "MS",
        default_value = DEFAULT_LEDGER_CLAIM_IDLE_MS,
        value_parser = whole::<u64>(DEFAULT_LEDGER_CLAIM_IDLE_MS, "QUOTA_LEDGER_CLAIM_IDLE_MS", "milliseconds", 0),
        global = true)]
    ledger_claim_idle_ms: u64,
    /// How often each instance checks whether the policies changed, in milliseconds.
    #[arg(long, env = "QUOTA_POLICY_POLL_MS", value_name = "MS",
        default_value = DEFAULT_POLICY_POLL_MS,
        value_parser = whole::<u64>(DEFAULT_POLICY_POLL_MS, "QUOTA_POLICY_POLL_MS", "milliseconds", 0),
        global = true)]
    policy_poll_ms: u64,
    /// The most /quota/* requests served at once, so that the admitted ones keep their
    /// latency; the excess waits for a slot (newest first) or is answered 503 overloaded.
    #[arg(long, env = "QUOTA_MAX_IN_FLIGHT", value_name = "N",
        default_value = DEFAULT_MAX_IN_FLIGHT,
        value_parser = whole::<usize>(DEFAULT_MAX_IN_FLIGHT, "QUOTA_MAX_IN_FLIGHT", "requests", 1),
        global = true)]
    max_in_flight: usize,
    /// The most /quota/* requests waiting for a slot; past it the oldest waiter is answered
    /// 503 overloaded (0: the excess is answered at once).
    #[arg(long, env = "QUOTA_MAX_QUEUED", value_name = "N", default_value = DEFAULT_MAX_QUEUED,
        value_parser = whole::<usize>(DEFAULT_MAX_QUEUED, "QUOTA_MAX_QUEUED", "requests", 0),
        global = true)]
    max_queued: usize,
    /// The longest a /quota/* request waits for a slot before it is answered 503
    /// overloaded, in milliseconds.
    #[arg(long, env = "QUOTA_QUEUE_WAIT_MS", value_name = "MS",
        default_value = DEFAULT_QUEUE_WAIT_MS,
        value_parser = whole::<u64>(DEFAULT_QUEUE_WAIT_MS, "QUOTA_QUEUE_WAIT_MS", "milliseconds", 0),
        global = true)]
    queue_wait_ms: u64,
    /// The most ledger entries waiting in the Redis streams (all shards) for SQL, e.g.
    /// while Postgres is down; past it consumes are answered 503 ledger-backlog-full (about
    /// 170 bytes of Redis memory each for a one-policy consume, more with an idempotency key
    /// or several policies: the default takes about 170 MB).
    #[arg(long, env = "QUOTA_LEDGER_BACKLOG_MAX", value_name = "N",
        default_value = DEFAULT_LEDGER_BACKLOG_MAX,
        value_parser = whole::<u64>(DEFAULT_LEDGER_BACKLOG_MAX, "QUOTA_LEDGER_BACKLOG_MAX", "entries", 1),
        global = true)]
    ledger_backlog_max: u64,
    /// While the ledger drain's latest commit carried an entry older than this many
    /// milliseconds, /quota/* requests wait 1 ms before they are served, so that the drain
    /// keeps up under a sustained full load (0: never).
    #[arg(long, env = "QUOTA_LEDGER_PACE_MS", value_name = "MS",
        default_value = DEFAULT_LEDGER_PACE_MS,
        value_parser = whole::<u64>(DEFAULT_LEDGER_PACE_MS, "QUOTA_LEDGER_PACE_MS", "milliseconds", 0),
        global = true)]
    ledger_pace_ms: u64,
    /// How often, in seconds, the service compares every live budget with the usage its
    /// ledger gives it, exporting quota_counter_drift_budgets and logging each drifting
    /// budget once (0: never).
    #[arg(long, env = "QUOTA_VERIFY_INTERVAL_S", value_name = "SECONDS",
        default_value = DEFAULT_VERIFY_INTERVAL_S,
        value_parser = whole::<u64>(DEFAULT_VERIFY_INTERVAL_S, "QUOTA_VERIFY_INTERVAL_S", "seconds", 0),
        global = true)]
    verify_interval_s: u64,
    /// Embedded default: snapshot the counters once this many ledger entries were committed
    /// after the last snapshot, besides every 5 minutes, so that a start after kill -9
    /// replays at most about this many (0: every 5 minutes only).
    #[arg(long, env = "QUOTA_SNAPSHOT_ENTRIES", value_name = "ENTRIES",
        default_value = DEFAULT_SNAPSHOT_ENTRIES,
        value_parser = whole::<u64>(DEFAULT_SNAPSHOT_ENTRIES, "QUOTA_SNAPSHOT_ENTRIES", "entries", 0),
        global = true)]
    snapshot_entries: u64,
    /// Redis mode: how often, in seconds, the janitor checkpoints the ledger's replay, so
    /// that a rebuild after Redis lost its data replays only the entries after it (0:
    /// never, a rebuild replays the whole horizon).
    #[arg(long, env = "QUOTA_CHECKPOINT_EVERY_S", value_name = "SECONDS",
        default_value = DEFAULT_CHECKPOINT_EVERY_S,
        value_parser = whole::<u64>(DEFAULT_CHECKPOINT_EVERY_S, "QUOTA_CHECKPOINT_EVERY_S", "seconds", 0),
        global = true)]
    checkpoint_every_s: u64,
}

impl ConfigArgs {
    /// The command-line definition of the configuration alone; building it reads the
    /// process environment.
    #[cfg(test)]
    fn command() -> clap::Command {
        Self::augment_args(clap::Command::new("quota-ledger"))
    }

    /// Parses flags alone (`argv` without the program name), ignoring the environment.
    #[cfg(test)]
    fn from_flags<I>(argv: I) -> anyhow::Result<Self>
    where
        I: IntoIterator,
        I::Item: Into<std::ffi::OsString> + Clone,
    {
        let program = std::iter::once(std::ffi::OsString::from("quota-ledger"));
        let matches = Self::command()
            .mut_args(|arg| arg.env(None::<&'static str>))
            .try_get_matches_from(program.chain(argv.into_iter().map(Into::into)))
            .context("reading the configuration")?;
        Ok(<Self as clap::FromArgMatches>::from_arg_matches(&matches)?)
    }
}

impl Settings {
    /// Reads the settings through `lookup` instead of the process environment (tests use a
    /// map), with the same defaults and checks.
    #[cfg(test)]
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        // Each variable `lookup` knows becomes its flag; the process environment is not read.
        let mut argv = Vec::new();
        for arg in ConfigArgs::command().get_arguments() {
            let (Some(name), Some(flag)) = (arg.get_env().and_then(|n| n.to_str()), arg.get_long())
            else {
                continue;
            };
            if let Some(value) = lookup(name) {
                argv.push(format!("--{flag}={value}"));
            }
        }
        Self::from_args(ConfigArgs::from_flags(argv)?)
    }

    /// Builds the settings from the configuration as given, checking what spans several
    /// variables; the error names the variable and what it must be.
    pub fn from_args(args: ConfigArgs) -> anyhow::Result<Self> {
        let redis_urls = args.redis_url.map(|urls| urls.0).unwrap_or_default();
        if args.redis_cluster && redis_urls.is_empty() {
            bail!("REDIS_CLUSTER=true needs REDIS_URL to list the cluster's nodes");
        }
        let redis_sentinel = sentinel(
            args.redis_sentinels.map(|urls| urls.0).unwrap_or_default(),
            args.redis_sentinel_master,
            args.redis_cluster,
            &redis_urls,
        )?;
        let redis_tls = RedisTlsFiles {
            ca_file: non_empty_path(args.redis_ca_file),
            cert_file: non_empty_path(args.redis_cert_file),
            key_file: non_empty_path(args.redis_key_file),
        };
        if redis_tls.cert_file.is_some() != redis_tls.key_file.is_some() {
            bail!(
                "QUOTA_REDIS_CERT_FILE and QUOTA_REDIS_KEY_FILE go together: a client \
                 certificate needs its key, and a key its certificate"
            );
        }
        Ok(Self {
            listen: args.listen,
            grpc_listen: args.grpc_listen.and_then(|listen| listen.0),
            database_url: args.database_url,
            redis_urls,
            redis_cluster: args.redis_cluster,
            redis_sentinel,
            redis_tls,
            redis_allow_eviction: args.redis_allow_eviction,
            webhook_allow_private: args.webhook_allow_private,
            redis_prefix: args.redis_prefix,
            redis_timeout: Duration::from_millis(args.redis_timeout_ms.max(1)),
            max_clock_offset: Duration::from_millis(args.max_clock_offset_ms),
            redis_min_replicas: args.redis_min_replicas,
            admin_token: non_blank(args.admin_token),
            client_tokens: non_blank(args.client_tokens)
                .map(|v| {
                    split_list(v.expose())
                        .into_iter()
                        .map(Secret::new)
                        .collect()
                })
                .unwrap_or_default(),
            on_store_error: args.on_store_error,
            log_json: args.log_format == "json",
            ledger_retention_days: args.ledger_retention_days.0,
            ledger_claim_idle: Duration::from_millis(args.ledger_claim_idle_ms.max(1)),
            policy_poll: Duration::from_millis(args.policy_poll_ms.max(1)),
            max_in_flight: args.max_in_flight,
            max_queued: args.max_queued,
            queue_wait: Duration::from_millis(args.queue_wait_ms),
            ledger_backlog_max: args.ledger_backlog_max,
            ledger_pace: Duration::from_millis(args.ledger_pace_ms),
            verify_interval: (args.verify_interval_s > 0)
                .then(|| Duration::from_secs(args.verify_interval_s)),
            snapshot_entries: args.snapshot_entries,
            checkpoint_every: (args.checkpoint_every_s > 0)
                .then(|| Duration::from_secs(args.checkpoint_every_s)),
        })
    }
}

#[cfg(test)]
mod env_example;
#[cfg(test)]
mod tests;
