//! The configuration's value parsers (what clap calls for each variable: defaults for
//! blank values, whole numbers within bounds, lists, addresses) and the checks that take
//! several settings together (Sentinel).

use super::{
    OnStoreError, Secret, SentinelSettings, DEFAULT_LEDGER_RETENTION_DAYS, DEFAULT_ON_STORE_ERROR,
    DEFAULT_REDIS_PREFIX,
};
use anyhow::bail;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A comma-separated list of URLs, blank items dropped.
#[derive(Debug, Clone)]
pub(super) struct Urls(pub(super) Vec<String>);

/// A gRPC address, or none (a blank value).
#[derive(Debug, Clone, Copy)]
pub(super) struct Listen(pub(super) Option<SocketAddr>);

/// clap's parser for secret values: any text, kept out of `Debug` output from the start.
pub(super) fn secret(value: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(value))
}

/// `value`, or `default` when it is empty or blank (a variable set to nothing is unset).
pub(super) fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.trim().is_empty() {
        default
    } else {
        value
    }
}

/// A parser of `T` that reads a blank value as `default`; its error says what `variable`
/// must be (`expected`).
pub(super) fn parsed<T: std::str::FromStr>(
    default: &'static str,
    variable: &'static str,
    expected: &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |value| {
        or_default(value, default)
            .parse()
            .map_err(|_| format!("{variable} must be {expected}, not '{value}'"))
    }
}

/// A parser of a whole number of `unit`s, at least `min`, that reads a blank value as
/// `default`.
pub(super) fn whole<
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
>(
    default: &'static str,
    variable: &'static str,
    unit: &'static str,
    min: T,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |value| {
        let number: T = or_default(value, default)
            .parse()
            .map_err(|_| format!("{variable} must be a whole number of {unit}, not '{value}'"))?;
        match number >= min {
            true => Ok(number),
            false => Err(format!("{variable} must be at least {min}")),
        }
    }
}

/// Days the ledger keeps entries; `None` for ever (clap takes an `Option` field for an
/// optional flag, hence the wrapper).
#[derive(Debug, Clone, Copy)]
pub(super) struct KeepDays(pub(super) Option<u32>);

/// `QUOTA_LEDGER_RETENTION_DAYS`: `forever` (`None`), or whole days, at least 1.
pub(super) fn retention_days(value: &str) -> Result<KeepDays, String> {
    const VARIABLE: &str = "QUOTA_LEDGER_RETENTION_DAYS";
    match or_default(value, DEFAULT_LEDGER_RETENTION_DAYS) {
        "forever" => Ok(KeepDays(None)),
        days => whole::<u32>(DEFAULT_LEDGER_RETENTION_DAYS, VARIABLE, "days", 1)(days)
            .map(|days| KeepDays(Some(days)))
            .map_err(|e| format!("{e}, or forever")),
    }
}

/// A parser of true, false, 1 or 0 that reads a blank value as `default`.
pub(super) fn switch(
    default: &'static str,
    variable: &'static str,
) -> impl Fn(&str) -> Result<bool, String> + Clone + Send + Sync + 'static {
    move |value| match or_default(value, default) {
        "false" | "0" => Ok(false),
        "true" | "1" => Ok(true),
        other => Err(format!("{variable} must be true or false, not '{other}'")),
    }
}

/// A parser of text that reads a blank value as `default`.
pub(super) fn text(
    default: &'static str,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |value| Ok(or_default(value, default).to_owned())
}

/// A comma-separated list; blank items are dropped.
pub(super) fn list(value: &str) -> Result<Urls, std::convert::Infallible> {
    Ok(Urls(split_list(value)))
}

/// A key prefix: no braces. Redis Cluster hashes the first `{...}` of a key: braces in
/// the prefix would make it the hash tag of every key, putting all subjects on one slot.
pub(super) fn prefix(value: &str) -> Result<String, String> {
    let prefix = or_default(value, DEFAULT_REDIS_PREFIX);
    match prefix.contains(['{', '}']) {
        true => Err(
            "QUOTA_REDIS_PREFIX must not contain '{' or '}': keys carry their own hash tag"
                .to_owned(),
        ),
        false => Ok(prefix.to_owned()),
    }
}

/// The gRPC address, or none when blank.
pub(super) fn grpc_address(value: &str) -> Result<Listen, String> {
    match value.trim() {
        "" => Ok(Listen(None)),
        address => address.parse().map(|a| Listen(Some(a))).map_err(|_| {
            "QUOTA_GRPC_LISTEN must be an address such as 127.0.0.1:8081 (or unset: no gRPC)"
                .to_owned()
        }),
    }
}

/// deny or allow, a blank value read as deny.
pub(super) fn on_store_error(value: &str) -> Result<OnStoreError, String> {
    match or_default(value, DEFAULT_ON_STORE_ERROR) {
        "deny" => Ok(OnStoreError::Deny),
        "allow" => Ok(OnStoreError::Allow),
        other => Err(format!(
            "QUOTA_ON_STORE_ERROR must be deny or allow, not '{other}'"
        )),
    }
}

/// `value` unless it is empty or blank.
pub(super) fn non_blank(value: Option<Secret>) -> Option<Secret> {
    value.filter(|v| !v.expose().trim().is_empty())
}

/// The Sentinel settings, checked: both variables or neither, not with a cluster, and at
/// most one `REDIS_URL` (the primary's scheme and credentials).
pub(super) fn sentinel(
    sentinels: Vec<String>,
    master: Option<String>,
    cluster: bool,
    redis_urls: &[String],
) -> anyhow::Result<Option<SentinelSettings>> {
    let master = master
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty());
    match (sentinels.is_empty(), master) {
        (true, None) => Ok(None),
        (true, Some(_)) => bail!("REDIS_SENTINEL_MASTER needs REDIS_SENTINELS (host:port,...)"),
        (false, None) => bail!(
            "REDIS_SENTINELS needs REDIS_SENTINEL_MASTER: the name the sentinels know the \
             primary by"
        ),
        (false, Some(_)) if cluster => {
            bail!("REDIS_SENTINELS and REDIS_CLUSTER=true exclude each other")
        }
        (false, Some(_)) if redis_urls.len() > 1 => bail!(
            "with REDIS_SENTINELS, REDIS_URL is at most one URL (the primary's scheme, user, \
             password and database)"
        ),
        (false, Some(master)) => {
            if let Some(bad) = sentinels.iter().find(|s| !is_host_port(s)) {
                bail!("REDIS_SENTINELS must list host:port addresses, not '{bad}'");
            }
            Ok(Some(SentinelSettings { sentinels, master }))
        }
    }
}

/// `host:port` with a port number.
pub(super) fn is_host_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// A path, or none when blank.
pub(super) fn non_empty_path(path: Option<PathBuf>) -> Option<PathBuf> {
    path.filter(|p| !p.as_os_str().is_empty())
}

pub(super) fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
