//! Typed settings, read once from the environment (names as in the product contract) or
//! from the flags that mirror it.
//!
//! clap reads them ([`ConfigArgs`]), so `quota-ledger --help` lists every variable with its
//! default; [`Settings::from_args`] then checks them and builds [`Settings`]. clap only
//! collects text: a bad value is reported by `from_args` (naming the variable), and never
//! stops a command that does not use the configuration, such as `openapi`.

use anyhow::{bail, Context};
use clap::Args;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use crate::engine::OnStoreError;

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
    /// Serve on a Redis whose `maxmemory-policy` may evict keys
    /// (`QUOTA_REDIS_ALLOW_EVICTION`); refused by default.
    pub redis_allow_eviction: bool,
    /// Prefix of every Redis key (`QUOTA_REDIS_PREFIX`), so several deployments can share one Redis.
    pub redis_prefix: String,
    /// Deadline of one Redis call (`QUOTA_REDIS_TIMEOUT_MS`).
    pub redis_timeout: Duration,
    /// Bearer token for `/admin/*` (`QUOTA_ADMIN_TOKEN`); `None` generates one at start.
    pub admin_token: Option<Secret>,
    /// Bearer tokens for `/quota/*` (`QUOTA_CLIENT_TOKENS`); empty leaves them open.
    pub client_tokens: Vec<Secret>,
    /// Fail-closed or fail-open when Redis is down (`QUOTA_ON_STORE_ERROR`).
    pub on_store_error: OnStoreError,
    /// JSON log lines (`QUOTA_LOG_FORMAT=json`) instead of human-readable ones.
    pub log_json: bool,
    /// Days ledger entries are kept before the retention task deletes them
    /// (`QUOTA_LEDGER_RETENTION_DAYS`, at least 1).
    pub ledger_retention_days: u32,
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
            .field("redis_allow_eviction", &self.redis_allow_eviction)
            .field("redis_prefix", &self.redis_prefix)
            .field("redis_timeout", &self.redis_timeout)
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
            .finish()
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_DATABASE_URL: &str = "sqlite://quota-ledger.db";
const DEFAULT_REDIS_CLUSTER: &str = "false";
const DEFAULT_REDIS_ALLOW_EVICTION: &str = "false";
const DEFAULT_REDIS_PREFIX: &str = "ql";
const DEFAULT_REDIS_TIMEOUT_MS: &str = "50";
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

/// The configuration as given, one text per variable (or flag), defaults filled in; an
/// empty or blank value counts as unset. [`Settings::from_args`] checks it.
///
/// Its arguments are global: they may follow any subcommand (`quota-ledger serve --help`
/// lists them too). Values that may hold a secret (tokens, and URLs with a password) are
/// never shown by `--help`, and tokens never by `Debug`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Configuration (environment variables, or these flags)")]
pub struct ConfigArgs {
    /// Address to serve on; port 0 picks a free one.
    #[arg(long, env = "QUOTA_LISTEN", value_name = "ADDR", default_value = DEFAULT_LISTEN,
        global = true)]
    listen: String,
    /// Policies and ledger: postgres://… in production, sqlite://FILE embedded.
    #[arg(long, env = "DATABASE_URL", value_name = "URL", default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true, global = true)]
    database_url: String,
    /// Counter store: redis://…, or with --redis-cluster a comma-separated list of the
    /// cluster's nodes. Unset: in-process counters.
    #[arg(
        long,
        env = "REDIS_URL",
        value_name = "URLS",
        hide_env_values = true,
        global = true
    )]
    redis_url: Option<String>,
    /// Address of Envoy's rate limit service (gRPC ShouldRateLimit, and the gRPC health
    /// service); port 0 picks a free one. Unset: no gRPC.
    #[arg(long, env = "QUOTA_GRPC_LISTEN", value_name = "ADDR", global = true)]
    grpc_listen: Option<String>,
    /// true when REDIS_URL lists Redis Cluster nodes (true, false, 1 or 0).
    #[arg(long, env = "REDIS_CLUSTER", value_name = "BOOL",
        default_value = DEFAULT_REDIS_CLUSTER, global = true)]
    redis_cluster: String,
    /// Serve on a Redis whose maxmemory-policy may evict keys (counters, idempotency
    /// records, holds, undrained ledger entries), accepting that risk; refused by default.
    #[arg(long, env = "QUOTA_REDIS_ALLOW_EVICTION", value_name = "BOOL",
        default_value = DEFAULT_REDIS_ALLOW_EVICTION, global = true)]
    redis_allow_eviction: String,
    /// Prefix of every Redis key, so several deployments can share one Redis; no { or }.
    #[arg(long, env = "QUOTA_REDIS_PREFIX", value_name = "PREFIX",
        default_value = DEFAULT_REDIS_PREFIX, global = true)]
    redis_prefix: String,
    /// Deadline of one Redis call, connection included, in milliseconds.
    #[arg(long, env = "QUOTA_REDIS_TIMEOUT_MS", value_name = "MS",
        default_value = DEFAULT_REDIS_TIMEOUT_MS, global = true)]
    redis_timeout_ms: String,
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
        default_value = DEFAULT_ON_STORE_ERROR, global = true)]
    on_store_error: String,
    /// json for one JSON object per log line; anything else is human-readable text.
    #[arg(long, env = "QUOTA_LOG_FORMAT", value_name = "FORMAT",
        default_value = DEFAULT_LOG_FORMAT, global = true)]
    log_format: String,
    /// Days ledger entries are kept (at least 1).
    #[arg(long, env = "QUOTA_LEDGER_RETENTION_DAYS", value_name = "DAYS",
        default_value = DEFAULT_LEDGER_RETENTION_DAYS, global = true)]
    ledger_retention_days: String,
    /// How long a drained but unacknowledged ledger entry waits before another instance
    /// claims it, in milliseconds.
    #[arg(long, env = "QUOTA_LEDGER_CLAIM_IDLE_MS", value_name = "MS",
        default_value = DEFAULT_LEDGER_CLAIM_IDLE_MS, global = true)]
    ledger_claim_idle_ms: String,
    /// How often each instance checks whether the policies changed, in milliseconds.
    #[arg(long, env = "QUOTA_POLICY_POLL_MS", value_name = "MS",
        default_value = DEFAULT_POLICY_POLL_MS, global = true)]
    policy_poll_ms: String,
    /// The most /quota/* requests served at once, so that the admitted ones keep their
    /// latency; the excess waits for a slot (newest first) or is answered 503 overloaded.
    #[arg(long, env = "QUOTA_MAX_IN_FLIGHT", value_name = "N",
        default_value = DEFAULT_MAX_IN_FLIGHT, global = true)]
    max_in_flight: String,
    /// The most /quota/* requests waiting for a slot; past it the oldest waiter is answered
    /// 503 overloaded (0: the excess is answered at once).
    #[arg(long, env = "QUOTA_MAX_QUEUED", value_name = "N",
        default_value = DEFAULT_MAX_QUEUED, global = true)]
    max_queued: String,
    /// The longest a /quota/* request waits for a slot before it is answered 503
    /// overloaded, in milliseconds.
    #[arg(long, env = "QUOTA_QUEUE_WAIT_MS", value_name = "MS",
        default_value = DEFAULT_QUEUE_WAIT_MS, global = true)]
    queue_wait_ms: String,
    /// The most ledger entries waiting in the Redis streams (all shards) for SQL, e.g.
    /// while Postgres is down; past it consumes are answered 503 ledger-backlog-full (about
    /// 200 bytes of Redis memory each: the default takes about 200 MB).
    #[arg(long, env = "QUOTA_LEDGER_BACKLOG_MAX", value_name = "N",
        default_value = DEFAULT_LEDGER_BACKLOG_MAX, global = true)]
    ledger_backlog_max: String,
    /// While the ledger drain's latest commit carried an entry older than this many
    /// milliseconds, /quota/* requests wait 1 ms before they are served, so that the drain
    /// keeps up under a sustained full load (0: never).
    #[arg(long, env = "QUOTA_LEDGER_PACE_MS", value_name = "MS",
        default_value = DEFAULT_LEDGER_PACE_MS, global = true)]
    ledger_pace_ms: String,
    /// How often, in seconds, the service compares every live budget with the usage its
    /// ledger gives it, exporting quota_counter_drift_budgets and logging each drifting
    /// budget once (0: never).
    #[arg(long, env = "QUOTA_VERIFY_INTERVAL_S", value_name = "SECONDS",
        default_value = DEFAULT_VERIFY_INTERVAL_S, global = true)]
    verify_interval_s: String,
}

/// clap's parser for secret values: any text, kept out of `Debug` output from the start.
fn secret(value: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(value))
}

/// `value`, or `default` when it is empty or blank (a variable set to nothing is unset).
fn or_default(value: String, default: &str) -> String {
    if value.trim().is_empty() {
        default.to_owned()
    } else {
        value
    }
}

/// `value` unless it is empty or blank.
fn non_blank(value: Option<Secret>) -> Option<Secret> {
    value.filter(|v| !v.expose().trim().is_empty())
}

/// Parses a whole number, or fails with `message`.
fn number<T: std::str::FromStr>(
    value: String,
    default: &str,
    message: &'static str,
) -> anyhow::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    or_default(value, default).parse().context(message)
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

    /// Checks the configuration as given and builds the settings; the error names the
    /// variable and what it must be.
    #[expect(
        clippy::too_many_lines,
        reason = "one check per variable, in the order of `ConfigArgs`; clap's typed value parsers are to take them over"
    )]
    pub fn from_args(args: ConfigArgs) -> anyhow::Result<Self> {
        let listen = or_default(args.listen, DEFAULT_LISTEN)
            .parse()
            .context("QUOTA_LISTEN must be an address such as 127.0.0.1:8080")?;
        let grpc_listen = match args.grpc_listen.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(address) => Some(address.parse().context(
                "QUOTA_GRPC_LISTEN must be an address such as 127.0.0.1:8081 (or unset: no gRPC)",
            )?),
        };
        let redis_urls: Vec<String> = args.redis_url.map(|v| split_list(&v)).unwrap_or_default();
        let redis_cluster = match or_default(args.redis_cluster, DEFAULT_REDIS_CLUSTER).as_str() {
            "false" | "0" => false,
            "true" | "1" => true,
            other => bail!("REDIS_CLUSTER must be true or false, not '{other}'"),
        };
        let redis_allow_eviction =
            match or_default(args.redis_allow_eviction, DEFAULT_REDIS_ALLOW_EVICTION).as_str() {
                "false" | "0" => false,
                "true" | "1" => true,
                other => bail!("QUOTA_REDIS_ALLOW_EVICTION must be true or false, not '{other}'"),
            };
        if redis_cluster && redis_urls.is_empty() {
            bail!("REDIS_CLUSTER=true needs REDIS_URL to list the cluster's nodes");
        }
        let on_store_error = match or_default(args.on_store_error, DEFAULT_ON_STORE_ERROR).as_str()
        {
            "deny" => OnStoreError::Deny,
            "allow" => OnStoreError::Allow,
            other => bail!("QUOTA_ON_STORE_ERROR must be deny or allow, not '{other}'"),
        };
        let redis_prefix = or_default(args.redis_prefix, DEFAULT_REDIS_PREFIX);
        if redis_prefix.contains(['{', '}']) {
            // Redis Cluster hashes the first `{...}` of a key: braces in the prefix would make
            // it the hash tag of every key, putting all subjects on one slot (one node).
            bail!(
                "QUOTA_REDIS_PREFIX must not contain '{{' or '}}': keys carry their own hash tag"
            );
        }
        let redis_timeout_ms: u64 = number(
            args.redis_timeout_ms,
            DEFAULT_REDIS_TIMEOUT_MS,
            "QUOTA_REDIS_TIMEOUT_MS must be a whole number of milliseconds",
        )?;
        let ledger_retention_days: u32 = number(
            args.ledger_retention_days,
            DEFAULT_LEDGER_RETENTION_DAYS,
            "QUOTA_LEDGER_RETENTION_DAYS must be a whole number of days",
        )?;
        let ledger_claim_idle_ms: u64 = number(
            args.ledger_claim_idle_ms,
            DEFAULT_LEDGER_CLAIM_IDLE_MS,
            "QUOTA_LEDGER_CLAIM_IDLE_MS must be a whole number of milliseconds",
        )?;
        if ledger_retention_days == 0 {
            bail!("QUOTA_LEDGER_RETENTION_DAYS must be at least 1");
        }
        let policy_poll_ms: u64 = number(
            args.policy_poll_ms,
            DEFAULT_POLICY_POLL_MS,
            "QUOTA_POLICY_POLL_MS must be a whole number of milliseconds",
        )?;
        let max_in_flight: usize = number(
            args.max_in_flight,
            DEFAULT_MAX_IN_FLIGHT,
            "QUOTA_MAX_IN_FLIGHT must be a whole number of requests",
        )?;
        if max_in_flight == 0 {
            bail!("QUOTA_MAX_IN_FLIGHT must be at least 1");
        }
        let max_queued: usize = number(
            args.max_queued,
            DEFAULT_MAX_QUEUED,
            "QUOTA_MAX_QUEUED must be a whole number of requests",
        )?;
        let queue_wait_ms: u64 = number(
            args.queue_wait_ms,
            DEFAULT_QUEUE_WAIT_MS,
            "QUOTA_QUEUE_WAIT_MS must be a whole number of milliseconds",
        )?;
        let ledger_backlog_max: u64 = number(
            args.ledger_backlog_max,
            DEFAULT_LEDGER_BACKLOG_MAX,
            "QUOTA_LEDGER_BACKLOG_MAX must be a whole number of entries",
        )?;
        if ledger_backlog_max == 0 {
            bail!("QUOTA_LEDGER_BACKLOG_MAX must be at least 1");
        }
        let ledger_pace_ms: u64 = number(
            args.ledger_pace_ms,
            DEFAULT_LEDGER_PACE_MS,
            "QUOTA_LEDGER_PACE_MS must be a whole number of milliseconds",
        )?;
        let verify_interval_s: u64 = number(
            args.verify_interval_s,
            DEFAULT_VERIFY_INTERVAL_S,
            "QUOTA_VERIFY_INTERVAL_S must be a whole number of seconds",
        )?;
        Ok(Self {
            listen,
            grpc_listen,
            database_url: or_default(args.database_url, DEFAULT_DATABASE_URL),
            redis_urls,
            redis_cluster,
            redis_allow_eviction,
            redis_prefix,
            redis_timeout: Duration::from_millis(redis_timeout_ms.max(1)),
            admin_token: non_blank(args.admin_token),
            client_tokens: non_blank(args.client_tokens)
                .map(|v| {
                    split_list(v.expose())
                        .into_iter()
                        .map(Secret::new)
                        .collect()
                })
                .unwrap_or_default(),
            on_store_error,
            log_json: args.log_format == "json",
            ledger_retention_days,
            ledger_claim_idle: Duration::from_millis(ledger_claim_idle_ms.max(1)),
            policy_poll: Duration::from_millis(policy_poll_ms.max(1)),
            max_in_flight,
            max_queued,
            queue_wait: Duration::from_millis(queue_wait_ms),
            ledger_backlog_max,
            ledger_pace: Duration::from_millis(ledger_pace_ms),
            verify_interval: (verify_interval_s > 0)
                .then(|| Duration::from_secs(verify_interval_s)),
        })
    }
}

fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> anyhow::Result<Settings> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_are_the_embedded_store_on_localhost() {
        let s = settings(&[]).expect("defaults are valid");
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database_url, "sqlite://quota-ledger.db");
        assert!(s.redis_urls.is_empty());
        assert_eq!(s.on_store_error, OnStoreError::Deny);
        assert!(s.admin_token.is_none());
    }

    #[test]
    fn the_policy_poll_interval_defaults_to_half_a_second_and_must_be_milliseconds() {
        let cases = [
            (None, Some(500)),
            (Some("250"), Some(250)),
            (Some("0"), Some(1)),
            (Some("1s"), None),
            (Some("-5"), None),
        ];
        for (value, expected) in cases {
            let pairs: Vec<(&str, &str)> = value
                .map(|v| ("QUOTA_POLICY_POLL_MS", v))
                .into_iter()
                .collect();
            let parsed = settings(&pairs)
                .ok()
                .map(|s| s.policy_poll.as_millis() as u64);
            assert_eq!(parsed, expected, "QUOTA_POLICY_POLL_MS={value:?}");
        }
    }

    #[test]
    fn lists_and_switches_are_parsed_and_bad_values_rejected() {
        let s = settings(&[
            ("REDIS_URL", "redis://a:1, redis://b:2"),
            ("REDIS_CLUSTER", "true"),
            ("QUOTA_CLIENT_TOKENS", "t1,t2"),
            ("QUOTA_ON_STORE_ERROR", "allow"),
        ])
        .expect("valid");
        assert_eq!(s.redis_urls, vec!["redis://a:1", "redis://b:2"]);
        assert!(s.redis_cluster);
        assert_eq!(s.client_tokens.len(), 2);
        assert_eq!(s.on_store_error, OnStoreError::Allow);
        assert!(settings(&[("QUOTA_ON_STORE_ERROR", "maybe")]).is_err());
        assert!(settings(&[("REDIS_CLUSTER", "true")]).is_err());
        assert!(settings(&[("QUOTA_LISTEN", "nowhere")]).is_err());
        assert!(settings(&[("QUOTA_REDIS_PREFIX", "ql{prod}")]).is_err());
    }

    #[test]
    fn ledger_retention_is_400_days_unless_set_to_a_positive_whole_number() {
        assert_eq!(settings(&[]).expect("valid").ledger_retention_days, 400);
        let s = settings(&[("QUOTA_LEDGER_RETENTION_DAYS", "30")]).expect("valid");
        assert_eq!(s.ledger_retention_days, 30);
        for bad in ["0", "-1", "1.5", "a year"] {
            assert!(
                settings(&[("QUOTA_LEDGER_RETENTION_DAYS", bad)]).is_err(),
                "{bad} is refused"
            );
        }
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let s = settings(&[("QUOTA_ADMIN_TOKEN", "hunter2")]).expect("valid");
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn an_empty_or_blank_variable_counts_as_unset() {
        let s = settings(&[
            ("QUOTA_LISTEN", ""),
            ("DATABASE_URL", "  "),
            ("REDIS_URL", " "),
            ("REDIS_CLUSTER", ""),
            ("QUOTA_ADMIN_TOKEN", " \t"),
            ("QUOTA_CLIENT_TOKENS", ""),
            ("QUOTA_ON_STORE_ERROR", " "),
            ("QUOTA_LEDGER_RETENTION_DAYS", ""),
            ("QUOTA_POLICY_POLL_MS", "  "),
        ])
        .expect("blank values are unset, not invalid");
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database_url, "sqlite://quota-ledger.db");
        assert!(s.redis_urls.is_empty() && !s.redis_cluster);
        assert!(s.admin_token.is_none() && s.client_tokens.is_empty());
        assert_eq!(s.on_store_error, OnStoreError::Deny);
        assert_eq!(s.ledger_retention_days, 400);
        assert_eq!(s.policy_poll, Duration::from_millis(500));
    }

    #[test]
    fn a_flag_sets_what_its_variable_sets() {
        let args = ConfigArgs::from_flags([
            "--listen",
            "127.0.0.1:0",
            "--on-store-error=allow",
            "--client-tokens=a,b",
        ])
        .expect("valid flags");
        let s = Settings::from_args(args).expect("valid settings");
        assert_eq!(s.listen.port(), 0);
        assert_eq!(s.on_store_error, OnStoreError::Allow);
        assert_eq!(s.client_tokens, vec![Secret::new("a"), Secret::new("b")]);
    }

    #[test]
    fn values_that_may_hold_a_secret_are_kept_out_of_help_and_debug_output() {
        let command = ConfigArgs::command();
        for name in [
            "QUOTA_ADMIN_TOKEN",
            "QUOTA_CLIENT_TOKENS",
            "DATABASE_URL",
            "REDIS_URL",
        ] {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_env().is_some_and(|env| env == name))
                .unwrap_or_else(|| panic!("{name} is read"));
            assert!(
                arg.is_hide_env_values_set(),
                "--help hides the value of {name}"
            );
        }
        let args = ConfigArgs::from_flags(["--admin-token=hunter2", "--client-tokens=swordfish"])
            .expect("valid flags");
        let shown = format!("{args:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("swordfish"),
            "{shown}"
        );
    }

    #[test]
    fn debug_output_masks_the_passwords_of_urls() {
        for (url, shown) in [
            (
                "postgres://quota:s3cret@db:5432/quota",
                "postgres://quota:***@db:5432/quota",
            ),
            ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
            ("redis://user@cache:6379", "redis://user@cache:6379"),
            ("sqlite://quota-ledger.db", "sqlite://quota-ledger.db"),
        ] {
            assert_eq!(without_password(url), shown, "{url}");
        }
    }
}
