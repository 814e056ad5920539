//! The settings as the variables and flags give them.

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
fn ledger_retention_is_400_days_unless_set_to_a_positive_whole_number_or_forever() {
    assert_eq!(
        settings(&[]).expect("valid").ledger_retention_days,
        Some(400)
    );
    let s = settings(&[("QUOTA_LEDGER_RETENTION_DAYS", "30")]).expect("valid");
    assert_eq!(s.ledger_retention_days, Some(30));
    let s = settings(&[("QUOTA_LEDGER_RETENTION_DAYS", "forever")]).expect("valid");
    assert_eq!(s.ledger_retention_days, None);
    for bad in ["0", "-1", "1.5", "a year", "Forever"] {
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
    assert_eq!(s.ledger_retention_days, Some(400));
    assert_eq!(s.policy_poll, Duration::from_millis(500));
}

#[test]
fn a_bad_value_is_refused_naming_its_variable() {
    for (flag, says) in [
        (
            "--redis-timeout-ms=soon",
            "QUOTA_REDIS_TIMEOUT_MS must be a whole number of milliseconds",
        ),
        (
            "--max-in-flight=0",
            "QUOTA_MAX_IN_FLIGHT must be at least 1",
        ),
        ("--redis-cluster=yes", "REDIS_CLUSTER must be true or false"),
        ("--redis-prefix=a{b}", "QUOTA_REDIS_PREFIX must not contain"),
    ] {
        let error = ConfigArgs::from_flags([flag]).expect_err(flag);
        assert!(format!("{error:#}").contains(says), "{flag}: {error:#}");
    }
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
