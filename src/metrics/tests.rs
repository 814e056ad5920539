//! The exposition of each metric type, and the rules that bound label values.

use super::{Endpoint, Live, Metrics, UNKNOWN_ACTION};
use crate::domain::{Action, Measure, Mode, Policy, PolicyId, PolicySpec, Window};
use crate::engine::decision::policies::PolicyCache;
use crate::engine::store::{StoreError, StoreMemory};
use crate::engine::{Decision, EngineError, PolicyDecision};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::time::Duration;

/// Sample values by series (`name{labels}`), as written.
fn samples(text: &str) -> BTreeMap<&str, &str> {
    let lines = text.lines().filter(|line| !line.starts_with('#'));
    lines
        .map(|line| line.rsplit_once(' ').expect("`series value`"))
        .collect()
}

fn render(metrics: &Metrics) -> String {
    metrics.render(&PolicyCache::new(), &Live::default())
}

fn policy_decision(id: &str, mode: Mode, allowed: bool) -> PolicyDecision {
    PolicyDecision {
        policy_id: PolicyId::parse("id", id).expect("valid id"),
        measure: Measure::Count,
        mode,
        limit: 1,
        used: 1,
        remaining: 0,
        resets_at: Some(DateTime::UNIX_EPOCH),
        allowed,
        window_seconds: 60,
        budget: crate::domain::Budget::of_subject(
            &crate::domain::Subject::parse("subject", "s").expect("valid subject"),
        ),
    }
}

fn decision(allowed: bool, degraded: bool, policies: Vec<PolicyDecision>) -> Decision {
    Decision {
        allowed,
        retry_after_seconds: None,
        degraded,
        policies,
        at: DateTime::UNIX_EPOCH,
    }
}

/// A cache holding one enforce policy `p` for `action`.
fn cache_with(action: &str) -> PolicyCache {
    let policy = Policy {
        id: PolicyId::parse("id", "p").expect("valid id"),
        spec: PolicySpec::example(
            action,
            Measure::Count,
            10,
            Window::token_bucket(60).expect("valid window"),
        ),
        created_at: DateTime::UNIX_EPOCH,
        updated_at: DateTime::UNIX_EPOCH,
        version: 1,
    };
    let cache = PolicyCache::new();
    cache.install(1, vec![policy], vec![]);
    cache
}

fn requests(endpoint: &str, action: &str, result: &str) -> String {
    format!(
        "quota_requests_total{{endpoint=\"{endpoint}\",action=\"{action}\",result=\"{result}\"}}"
    )
}

#[test]
fn an_action_is_a_label_only_when_configured_and_otherwise_counts_as_unknown() {
    let metrics = Metrics::new();
    let cache = cache_with("sms.send");
    let unknown = EngineError::UnknownAction(Action::parse("a", "no.such").expect("valid"));
    metrics.observe(Endpoint::Consume, "no.such", Duration::ZERO, Err(&unknown));
    metrics.observe_invalid(Endpoint::Check, Some("sms.send"), &cache);
    metrics.observe_invalid(Endpoint::Check, Some("Bad Action 4711"), &cache);
    metrics.observe_invalid(Endpoint::Check, None, &cache);

    let text = metrics.render(&cache, &Live::default());
    let expected = BTreeMap::from([
        (requests("check", "sms.send", "invalid"), "1"),
        (requests("check", UNKNOWN_ACTION, "invalid"), "2"),
        (requests("consume", UNKNOWN_ACTION, "unknown_action"), "1"),
    ]);
    let counted: BTreeMap<String, &str> = samples(&text)
        .into_iter()
        .filter(|(series, _)| series.starts_with("quota_requests_total"))
        .map(|(series, value)| (series.to_owned(), value))
        .collect();
    assert_eq!(counted, expected, "{text}");
    for raw in ["no.such", "Bad Action"] {
        assert!(!text.contains(raw), "{raw} leaked into\n{text}");
    }
}

#[test]
fn each_policy_of_a_decision_is_counted_with_its_mode_and_its_own_outcome() {
    let metrics = Metrics::new();
    let policies = vec![
        policy_decision("daily", Mode::Enforce, false),
        policy_decision("trial", Mode::Shadow, true),
    ];
    let denied = decision(false, false, policies);
    metrics.observe(Endpoint::Check, "sms.send", Duration::ZERO, Ok(&denied));

    let text = render(&metrics);
    let samples = samples(&text);
    let decision = |policy: &str, mode: &str, outcome: &str| {
        let series = format!("quota_decisions_total{{endpoint=\"check\",action=\"sms.send\",policy=\"{policy}\",mode=\"{mode}\",outcome=\"{outcome}\"}}");
        samples.get(series.as_str()).copied()
    };
    assert_eq!(decision("daily", "enforce", "denied"), Some("1"), "{text}");
    assert_eq!(decision("trial", "shadow", "allowed"), Some("1"), "{text}");
    assert_eq!(
        samples.get(requests("check", "sms.send", "denied").as_str()),
        Some(&"1")
    );
    let series = samples.keys().filter(|s| s.starts_with("quota_decisions"));
    assert_eq!(series.count(), 2, "{text}");
}

#[test]
fn store_failures_are_counted_by_kind_and_a_degraded_allow_evaluates_no_policy() {
    let metrics = Metrics::new();
    let degraded = decision(true, true, vec![policy_decision("p", Mode::Enforce, true)]);
    metrics.observe(Endpoint::Consume, "a", Duration::ZERO, Ok(&degraded));
    let timeout = EngineError::Store(StoreError::Timeout("slow".into()));
    metrics.observe(Endpoint::Consume, "a", Duration::ZERO, Err(&timeout));
    let protocol = EngineError::Store(StoreError::Protocol("odd".into()));
    metrics.observe_store(Err(&protocol));

    let text = render(&metrics);
    let samples = samples(&text);
    let table = [
        (
            "quota_store_errors_total{store=\"counter\",kind=\"unavailable\"}",
            "1",
        ),
        (
            "quota_store_errors_total{store=\"counter\",kind=\"timeout\"}",
            "1",
        ),
        (
            "quota_store_errors_total{store=\"counter\",kind=\"protocol\"}",
            "1",
        ),
        ("quota_degraded_allows_total", "1"),
        (&requests("consume", "a", "degraded"), "1"),
        (&requests("consume", "a", "unavailable"), "1"),
    ];
    for (series, value) in table {
        assert_eq!(samples.get(series), Some(&value), "{series} in\n{text}");
    }
    assert!(!text.contains("quota_decisions"), "{text}");
}

#[test]
fn the_latency_histogram_has_cumulative_buckets_per_endpoint_with_its_sum_and_count() {
    let metrics = Metrics::new();
    let ok = decision(true, false, vec![]);
    for millis in [0, 3, 3, 700, 5_000] {
        let elapsed = Duration::from_millis(millis);
        metrics.observe(Endpoint::Check, "a", elapsed, Ok(&ok));
    }

    let text = render(&metrics);
    let samples = samples(&text);
    let name = "quota_decision_duration_seconds";
    let bucket = |endpoint: &str, le: &str| {
        // prometheus-client writes `le` before the family's labels.
        let series = format!("{name}_bucket{{le=\"{le}\",endpoint=\"{endpoint}\"}}");
        samples.get(series.as_str()).copied()
    };
    let check = [
        ("0.0005", "1"),
        ("0.001", "1"),
        ("0.0025", "1"),
        ("0.005", "3"),
        ("0.01", "3"),
        ("0.025", "3"),
        ("0.05", "3"),
        ("0.1", "3"),
        ("0.25", "3"),
        ("0.5", "3"),
        ("1.0", "4"),
        ("+Inf", "5"),
    ];
    for (le, count) in check {
        assert_eq!(bucket("check", le), Some(count), "le={le} in\n{text}");
        assert_eq!(bucket("consume", le), Some("0"), "le={le} in\n{text}");
        assert_eq!(
            bucket("should_rate_limit", le),
            Some("0"),
            "le={le} in\n{text}"
        );
    }
    let buckets = samples.keys().filter(|s| s.contains("_bucket{"));
    assert_eq!(buckets.count(), 3 * check.len(), "no other bucket");
    let count = format!("{name}_count{{endpoint=\"check\"}}");
    assert_eq!(samples.get(count.as_str()), Some(&"5"));
    let sum = format!("{name}_sum{{endpoint=\"check\"}}");
    let sum: f64 = samples[sum.as_str()].parse().expect("a number");
    assert!((sum - 5.706).abs() < 1e-9, "{sum}");
}

#[test]
fn scrape_time_gauges_report_the_cache_the_circuit_and_the_backlog_when_known() {
    let metrics = Metrics::new();
    let empty = metrics.render(&PolicyCache::new(), &Live::default());
    for absent in [
        "quota_policy_cache_last_reload_timestamp_seconds",
        "quota_ledger_backlog_entries",
        "quota_ledger_backlog_max_entries",
        "quota_redis_used_memory_bytes",
        "quota_counter_drift_budgets",
    ] {
        assert!(!empty.contains(absent), "{absent} in\n{empty}");
    }

    let live = Live {
        circuit_open: true,
        janitor: true,
        ledger_backlog: Some(7),
        ledger_backlog_max: Some(1_000),
        store_memory: Some(StoreMemory {
            used_bytes: 2_048,
            max_bytes: 4_096,
            policies: vec!["allkeys-lru".to_owned(), "noeviction".to_owned()],
        }),
        in_flight: 3,
        max_in_flight: 256,
        queued: 5,
        overloaded: 11,
        paced: 13,
        ledger_lag: {
            let lag = crate::engine::pipeline::lag::Lag::default();
            let now = Utc::now();
            let decided = [now, now, now - chrono::Duration::milliseconds(700)];
            lag.observe_all(now, decided.into_iter());
            lag.snapshot()
        },
        counter_drift_budgets: Some(2),
        alerts: crate::metrics::AlertsLive::default(),
        clock_offset_seconds: Some(-300.25),
        ..Live::default()
    };
    let text = metrics.render(&cache_with("a"), &live);
    let samples = samples(&text);
    let version = format!(
        "quota_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    let table = [
        ("quota_policy_cache_policies", "1"),
        ("quota_policy_cache_overrides", "0"),
        ("quota_counter_store_circuit_open", "1"),
        ("quota_janitor", "1"),
        ("quota_ledger_backlog_entries", "7"),
        ("quota_ledger_backlog_max_entries", "1000"),
        ("quota_redis_used_memory_bytes", "2048"),
        ("quota_redis_maxmemory_bytes", "4096"),
        ("quota_redis_maxmemory_policy{policy=\"allkeys-lru\"}", "1"),
        ("quota_redis_maxmemory_policy{policy=\"noeviction\"}", "1"),
        ("quota_in_flight_requests", "3"),
        ("quota_max_in_flight_requests", "256"),
        ("quota_queued_requests", "5"),
        ("quota_ledger_lag_seconds_bucket{le=\"0.005\"}", "2"),
        ("quota_ledger_lag_seconds_bucket{le=\"0.5\"}", "2"),
        ("quota_ledger_lag_seconds_bucket{le=\"1.0\"}", "3"),
        ("quota_ledger_lag_seconds_bucket{le=\"+Inf\"}", "3"),
        ("quota_ledger_lag_seconds_count", "3"),
        ("quota_ledger_lag_seconds_sum", "0.7"),
        ("quota_overloaded_total", "11"),
        ("quota_paced_total", "13"),
        ("quota_counter_drift_budgets", "2"),
        ("quota_clock_offset_seconds", "-300.25"),
        (version.as_str(), "1"),
    ];
    for (series, value) in table {
        assert_eq!(samples.get(series), Some(&value), "{series} in\n{text}");
    }
    let reload = samples["quota_policy_cache_last_reload_timestamp_seconds"];
    let reload: f64 = reload.parse().expect("a number");
    let now = Utc::now().timestamp_millis() as f64 / 1e3;
    assert!((now - reload).abs() < 60.0, "{reload} vs {now}");
}

#[test]
fn decisions_sent_to_redis_are_counted_with_the_calls_that_carried_them() {
    let live = Live {
        decision_calls: Some(crate::engine::store::DecisionCalls {
            decisions: 64,
            calls: 9,
        }),
        ..Live::default()
    };
    let text = Metrics::new().render(&PolicyCache::new(), &live);
    let samples = samples(&text);
    assert_eq!(samples.get("quota_redis_decisions_total"), Some(&"64"));
    assert_eq!(samples.get("quota_redis_decision_calls_total"), Some(&"9"));
    let without = Metrics::new().render(&PolicyCache::new(), &Live::default());
    assert!(!without.contains("quota_redis_decision"), "{without}");
}

#[test]
fn every_family_is_described_once_by_its_sample_name_in_the_0_0_4_format() {
    let metrics = Metrics::new();
    let allowed = decision(true, false, vec![policy_decision("p", Mode::Enforce, true)]);
    metrics.observe(Endpoint::Consume, "a", Duration::ZERO, Ok(&allowed));
    let live = Live {
        ledger_backlog: Some(0),
        ..Live::default()
    };
    let text = metrics.render(&cache_with("a"), &live);
    let comments: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    let expected = [
        "# HELP quota_requests_total Consume and check requests by endpoint, action and result.",
        "# TYPE quota_requests_total counter",
        "# HELP quota_decisions_total Per-policy outcomes of consume and check decisions (shadow policies over their limit count as denied).",
        "# TYPE quota_decisions_total counter",
        "# HELP quota_decision_duration_seconds Time the engine took to answer a consume or check (every call, errors included).",
        "# TYPE quota_decision_duration_seconds histogram",
        "# HELP quota_store_errors_total Counter-store failures: unavailable (unreachable), timeout (no answer in time) or protocol (unexpected answers).",
        "# TYPE quota_store_errors_total counter",
        "# HELP quota_degraded_allows_total Consumes and checks allowed unchecked because the counter store was down (QUOTA_ON_STORE_ERROR=allow).",
        "# TYPE quota_degraded_allows_total counter",
        "# HELP quota_auth_failures_total Requests refused for who sent them: missing, unknown, expired or revoked token or key (401), or a key that may not do it (forbidden, 403).",
        "# TYPE quota_auth_failures_total counter",
        "# HELP quota_policy_cache_policies Policies in the in-process cache, enabled or not.",
        "# TYPE quota_policy_cache_policies gauge",
        "# HELP quota_policy_cache_overrides Per-subject overrides in the in-process cache.",
        "# TYPE quota_policy_cache_overrides gauge",
        "# HELP quota_policy_cache_last_reload_timestamp_seconds When the policy cache was last rebuilt (Unix time).",
        "# TYPE quota_policy_cache_last_reload_timestamp_seconds gauge",
        "# HELP quota_counter_store_circuit_open 1 while the counter store's circuit breaker fails calls without trying.",
        "# TYPE quota_counter_store_circuit_open gauge",
        "# HELP quota_janitor 1 while this instance is the janitor: it sweeps after dead instances (their ledger entries and holds).",
        "# TYPE quota_janitor gauge",
        "# HELP quota_ledger_backlog_entries Ledger entries waiting in the Redis streams to be moved into SQL.",
        "# TYPE quota_ledger_backlog_entries gauge",
        "# HELP quota_in_flight_requests Quota requests being served now (admin, health and metrics are not counted).",
        "# TYPE quota_in_flight_requests gauge",
        "# HELP quota_max_in_flight_requests The most quota requests served at once (QUOTA_MAX_IN_FLIGHT).",
        "# TYPE quota_max_in_flight_requests gauge",
        "# HELP quota_ledger_lag_seconds Time from a decision to its ledger entry's commit in SQL (the drain in Redis mode, the group commit embedded).",
        "# TYPE quota_ledger_lag_seconds histogram",
        "# HELP quota_queued_requests Quota requests waiting for a slot now (at most QUOTA_MAX_QUEUED).",
        "# TYPE quota_queued_requests gauge",
        "# HELP quota_overloaded_total Quota requests answered 503 overloaded: no slot came free within QUOTA_QUEUE_WAIT_MS, or the queue was full.",
        "# TYPE quota_overloaded_total counter",
        "# HELP quota_paced_total Quota requests that waited 1 ms before being served because the ledger drain's latest commit carried an entry older than QUOTA_LEDGER_PACE_MS.",
        "# TYPE quota_paced_total counter",
        "# HELP quota_webhook_deliveries_total Webhook delivery attempts of this instance, by result (delivered: a 2xx answer).",
        "# TYPE quota_webhook_deliveries_total counter",
        "# HELP quota_webhooks_disabled_total Webhook endpoints this instance disabled after a day of failed attempts (webhook.disabled).",
        "# TYPE quota_webhooks_disabled_total counter",
        "# HELP quota_build_info Always 1; labelled with the version.",
        "# TYPE quota_build_info gauge",
    ];
    assert_eq!(comments, expected, "{text}");
    // Each sample belongs to the family described last before it.
    let mut family = "";
    for line in text.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            family = typed.split(' ').next().unwrap_or_default();
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let suffix = name.strip_prefix(family).unwrap_or("(another family)");
            assert!(
                ["", "_bucket", "_sum", "_count"].contains(&suffix),
                "{line} after # TYPE {family}"
            );
        }
    }
}
