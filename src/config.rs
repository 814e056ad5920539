//! Typed settings, read once from the environment (names as in the product contract).

use anyhow::{bail, Context};
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

/// Every setting of the service.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to serve on (`QUOTA_LISTEN`); port 0 picks a free one.
    pub listen: SocketAddr,
    /// Policy store (`DATABASE_URL`): `postgres://…` or `sqlite://…`.
    pub database_url: String,
    /// Counter store nodes (`REDIS_URL`, comma-separated); empty for in-process counters.
    pub redis_urls: Vec<String>,
    /// Whether `redis_urls` are Redis Cluster nodes (`REDIS_CLUSTER`).
    pub redis_cluster: bool,
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
}

impl Settings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let listen = get("QUOTA_LISTEN")
            .unwrap_or_else(|| "127.0.0.1:8080".to_owned())
            .parse()
            .context("QUOTA_LISTEN must be an address such as 127.0.0.1:8080")?;
        let redis_urls: Vec<String> = get("REDIS_URL").map(|v| split_list(&v)).unwrap_or_default();
        let redis_cluster = match get("REDIS_CLUSTER").as_deref() {
            None | Some("false" | "0") => false,
            Some("true" | "1") => true,
            Some(other) => bail!("REDIS_CLUSTER must be true or false, not '{other}'"),
        };
        if redis_cluster && redis_urls.is_empty() {
            bail!("REDIS_CLUSTER=true needs REDIS_URL to list the cluster's nodes");
        }
        let on_store_error = match get("QUOTA_ON_STORE_ERROR").as_deref() {
            None | Some("deny") => OnStoreError::Deny,
            Some("allow") => OnStoreError::Allow,
            Some(other) => bail!("QUOTA_ON_STORE_ERROR must be deny or allow, not '{other}'"),
        };
        let redis_prefix = get("QUOTA_REDIS_PREFIX").unwrap_or_else(|| "ql".to_owned());
        if redis_prefix.contains(['{', '}']) {
            // Redis Cluster hashes the first `{...}` of a key: braces in the prefix would make
            // it the hash tag of every key, putting all subjects on one slot (one node).
            bail!(
                "QUOTA_REDIS_PREFIX must not contain '{{' or '}}': keys carry their own hash tag"
            );
        }
        let redis_timeout_ms: u64 = get("QUOTA_REDIS_TIMEOUT_MS")
            .map(|v| v.parse())
            .transpose()
            .context("QUOTA_REDIS_TIMEOUT_MS must be a whole number of milliseconds")?
            .unwrap_or(50);
        let ledger_retention_days: u32 = get("QUOTA_LEDGER_RETENTION_DAYS")
            .map(|v| v.parse())
            .transpose()
            .context("QUOTA_LEDGER_RETENTION_DAYS must be a whole number of days")?
            .unwrap_or(400);
        let ledger_claim_idle_ms: u64 = get("QUOTA_LEDGER_CLAIM_IDLE_MS")
            .map(|v| v.parse())
            .transpose()
            .context("QUOTA_LEDGER_CLAIM_IDLE_MS must be a whole number of milliseconds")?
            .unwrap_or(30_000);
        if ledger_retention_days == 0 {
            bail!("QUOTA_LEDGER_RETENTION_DAYS must be at least 1");
        }
        let policy_poll_ms: u64 = get("QUOTA_POLICY_POLL_MS")
            .map(|v| v.parse())
            .transpose()
            .context("QUOTA_POLICY_POLL_MS must be a whole number of milliseconds")?
            .unwrap_or(500);
        Ok(Self {
            listen,
            database_url: get("DATABASE_URL")
                .unwrap_or_else(|| "sqlite://quota-ledger.db".to_owned()),
            redis_urls,
            redis_cluster,
            redis_prefix,
            redis_timeout: Duration::from_millis(redis_timeout_ms.max(1)),
            admin_token: get("QUOTA_ADMIN_TOKEN").map(Secret::new),
            client_tokens: get("QUOTA_CLIENT_TOKENS")
                .map(|v| split_list(&v).into_iter().map(Secret::new).collect())
                .unwrap_or_default(),
            on_store_error,
            log_json: get("QUOTA_LOG_FORMAT").as_deref() == Some("json"),
            ledger_retention_days,
            ledger_claim_idle: Duration::from_millis(ledger_claim_idle_ms.max(1)),
            policy_poll: Duration::from_millis(policy_poll_ms.max(1)),
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
}
