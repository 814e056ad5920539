//! Operating the service: `/metrics` counts what the quota endpoints answered, every
//! answer carries an `X-Request-Id`, and JSON logs carry it on every line of a request.

use crate::helpers::{
    calendar_policy, free_port, fresh_settings, spawn_app, spawn_with, CounterBackend,
    FreshSettings, PolicyBackend, TestApp,
};
use quota_ledger::config::{OnStoreError, Secret};
use reqwest::StatusCode;
use serde_json::json;
use std::collections::HashMap;

mod json_logs;
mod request_ids;

/// One scrape of `/metrics`.
struct Scrape {
    content_type: String,
    body: String,
    /// Sample values by series, e.g. `quota_build_info{version="0.1.0"}`.
    samples: HashMap<String, f64>,
}

impl Scrape {
    async fn of(app: &TestApp) -> Self {
        let response = app
            .client
            .get(format!("{}/metrics", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.text().await.unwrap();
        let samples = body
            .lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("`series value`");
                (series.to_owned(), value.parse().expect("a number"))
            })
            .collect();
        Self {
            content_type,
            body,
            samples,
        }
    }

    /// The value of `series`, whatever order its labels were written in.
    fn value(&self, series: &str) -> Option<f64> {
        let wanted = sorted_labels(series);
        let mut samples = self.samples.iter();
        samples
            .find(|(s, _)| sorted_labels(s) == wanted)
            .map(|(_, v)| *v)
    }

    /// The sum of every sample whose series starts with `prefix` and contains none of `but`.
    fn sum(&self, prefix: &str, but: &[&str]) -> f64 {
        let series = self.samples.iter();
        series
            .filter(|(s, _)| s.starts_with(prefix) && !but.iter().any(|b| s.contains(b)))
            .map(|(_, v)| v)
            .sum()
    }
}

/// `series` with its labels sorted: label order carries no meaning in the exposition,
/// and encoders differ (prometheus-client writes a histogram's `le` first).
fn sorted_labels(series: &str) -> (String, Vec<String>) {
    let Some((name, labels)) = series.split_once('{') else {
        return (series.to_owned(), Vec::new());
    };
    let labels = labels.strip_suffix('}').expect("labels end with `}`");
    let mut labels: Vec<String> = labels
        .split("\",")
        .map(|label| label.trim_end_matches('"').to_owned())
        .collect();
    labels.sort_unstable();
    (name.to_owned(), labels)
}

fn requests(endpoint: &str, action: &str, result: &str) -> String {
    format!(
        "quota_requests_total{{endpoint=\"{endpoint}\",action=\"{action}\",result=\"{result}\"}}"
    )
}

fn decisions(endpoint: &str, policy: &str, mode: &str, outcome: &str) -> String {
    format!("quota_decisions_total{{endpoint=\"{endpoint}\",action=\"sms.send\",policy=\"{policy}\",mode=\"{mode}\",outcome=\"{outcome}\"}}")
}

const SUBJECT: &str = "alice-7f3e-personal";

#[tokio::test]
async fn metrics_count_requests_and_each_policys_decision_by_label_but_never_by_subject() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms-daily", "sms.send", 2, "day", "UTC"))
        .await;
    let mut shadow = calendar_policy("sms-shadow", "sms.send", 1, "day", "UTC");
    shadow["mode"] = json!("shadow");
    app.must_create_policy(shadow).await;

    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(app.consume("sms.send", SUBJECT, 1).await.status, expected);
    }
    assert_eq!(
        app.check("sms.send", SUBJECT, 1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.consume("no-such.action-4711", SUBJECT, 1)
        .await
        .assert_problem(404);
    app.consume("sms.send", SUBJECT, 0)
        .await
        .assert_problem(422);
    app.quota(
        "/quota/consume",
        json!({"action": "Bad Action 4711", "subject": SUBJECT}),
    )
    .await
    .assert_problem(422);
    let malformed = app
        .client
        .post(format!("{}/quota/consume", app.address))
        .header("content-type", "application/json")
        .body("{\"action\": \"sms.send\",");
    app.send(malformed).await.assert_problem(400);

    let scrape = Scrape::of(&app).await;
    assert!(
        scrape.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        scrape.content_type
    );
    for counter in ["quota_requests_total", "quota_decisions_total"] {
        let typed = format!("\n# TYPE {counter} counter\n");
        assert!(
            scrape.body.contains(&typed),
            "0.0.4 names the family after its samples:\n{}",
            scrape.body
        );
    }
    assert!(!scrape.body.contains("# EOF"), "{}", scrape.body);
    let table = [
        (requests("consume", "sms.send", "allowed"), 2.0),
        (requests("consume", "sms.send", "denied"), 1.0),
        (requests("consume", "sms.send", "invalid"), 1.0),
        (requests("check", "sms.send", "denied"), 1.0),
        (requests("consume", "(unknown)", "unknown_action"), 1.0),
        (requests("consume", "(unknown)", "invalid"), 2.0),
        (decisions("consume", "sms-daily", "enforce", "allowed"), 2.0),
        (decisions("consume", "sms-daily", "enforce", "denied"), 1.0),
        // The shadow policy is over its limit from the second consume on, though that passed.
        (decisions("consume", "sms-shadow", "shadow", "allowed"), 1.0),
        (decisions("consume", "sms-shadow", "shadow", "denied"), 2.0),
        (decisions("check", "sms-daily", "enforce", "denied"), 1.0),
        (decisions("check", "sms-shadow", "shadow", "denied"), 1.0),
        (
            "quota_decision_duration_seconds_count{endpoint=\"consume\"}".to_owned(),
            4.0,
        ),
        (
            "quota_decision_duration_seconds_count{endpoint=\"check\"}".to_owned(),
            1.0,
        ),
        (
            "quota_decision_duration_seconds_bucket{endpoint=\"consume\",le=\"+Inf\"}".to_owned(),
            4.0,
        ),
        (
            "quota_store_errors_total{store=\"counter\",kind=\"unavailable\"}".to_owned(),
            0.0,
        ),
        (
            "quota_store_errors_total{store=\"counter\",kind=\"protocol\"}".to_owned(),
            0.0,
        ),
        ("quota_degraded_allows_total".to_owned(), 0.0),
        ("quota_policy_cache_policies".to_owned(), 2.0),
        (
            format!(
                "quota_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            ),
            1.0,
        ),
    ];
    for (series, expected) in table {
        assert_eq!(
            scrape.value(&series),
            Some(expected),
            "{series} in\n{}",
            scrape.body
        );
    }
    assert_eq!(
        scrape.sum("quota_requests_total", &[]),
        8.0,
        "nothing else was counted"
    );
    for endpoint in ["consume", "check"] {
        let reached_the_engine = scrape.sum(
            &format!("quota_requests_total{{endpoint=\"{endpoint}\""),
            &["result=\"invalid\""],
        );
        let timed = scrape.value(&format!(
            "quota_decision_duration_seconds_count{{endpoint=\"{endpoint}\"}}"
        ));
        assert_eq!(
            timed,
            Some(reached_the_engine),
            "every engine call is timed, once"
        );
    }
    for private in [SUBJECT, "alice", "no-such.action-4711", "Bad Action"] {
        assert!(
            !scrape.body.contains(private),
            "{private} leaked into\n{}",
            scrape.body
        );
    }
}

/// The README promises one request per consume, hold or check: a hold is counted (and
/// timed) as a consume.
#[tokio::test]
async fn a_hold_is_counted_as_a_consume() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms-daily", "sms.send", 2, "day", "UTC"))
        .await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "sms.send", "subject": SUBJECT, "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    let scrape = Scrape::of(&app).await;
    assert_eq!(
        scrape.value(&requests("consume", "sms.send", "allowed")),
        Some(1.0),
        "{}",
        scrape.body
    );
}

#[tokio::test]
async fn metrics_are_open_without_a_token_and_follow_the_policy_cache_without_naming_subjects() {
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.client_tokens = vec![Secret::new("client-token")];
    let app = spawn_with(settings).await;
    let before = Scrape::of(&app).await;
    assert_eq!(before.value("quota_policy_cache_policies"), Some(0.0));
    let started = before
        .value("quota_policy_cache_last_reload_timestamp_seconds")
        .expect("the startup reload is reported");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - started).abs() < 600.0,
        "wall-clock time: {started} vs {now}"
    );

    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let put = app.admin(
        reqwest::Method::PUT,
        "/admin/policies/p/overrides/bob-9c1d-personal",
    );
    let put = app.send(put.json(&json!({"limit": 50}))).await;
    assert_eq!(put.status, StatusCode::CREATED);

    let after = Scrape::of(&app).await;
    assert_eq!(after.value("quota_policy_cache_policies"), Some(1.0));
    assert_eq!(after.value("quota_policy_cache_overrides"), Some(1.0));
    let reloaded = after.value("quota_policy_cache_last_reload_timestamp_seconds");
    assert!(
        reloaded.is_some_and(|at| at >= started),
        "{reloaded:?} >= {started}"
    );
    assert!(!after.body.contains("bob"), "{}", after.body);
}

/// Settings whose Redis is a loopback port where nothing listens.
async fn dead_redis(on_error: OnStoreError) -> FreshSettings {
    let port = free_port();
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![format!("redis://127.0.0.1:{port}/")];
    settings.redis_timeout = std::time::Duration::from_millis(200);
    settings.on_store_error = on_error;
    settings
}

#[tokio::test]
async fn a_counter_store_outage_is_counted_as_store_errors_and_degraded_or_unavailable_answers() {
    let cases = [
        (OnStoreError::Allow, StatusCode::OK, "degraded", 1.0),
        (
            OnStoreError::Deny,
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            0.0,
        ),
    ];
    for (on_error, status, result, degraded_allows) in cases {
        let app = spawn_with(dead_redis(on_error).await).await;
        app.must_create_policy(calendar_policy("p", "sms.send", 10, "day", "UTC"))
            .await;
        assert_eq!(app.consume("sms.send", SUBJECT, 1).await.status, status);
        app.usage("sms.send", SUBJECT).await;

        let scrape = Scrape::of(&app).await;
        let unavailable = "quota_store_errors_total{store=\"counter\",kind=\"unavailable\"}";
        assert_eq!(
            scrape.value(unavailable),
            Some(2.0),
            "the consume and the usage read"
        );
        assert_eq!(
            scrape.value("quota_degraded_allows_total"),
            Some(degraded_allows)
        );
        assert_eq!(
            scrape.value(&requests("consume", "sms.send", result)),
            Some(1.0)
        );
        assert_eq!(
            scrape.sum("quota_decisions_total", &[]),
            0.0,
            "no policy was evaluated"
        );
    }
}

/// Every ledger entry that reaches SQL is counted in `quota_ledger_lag_seconds`: by the
/// group commit on the embedded default, by the drain on Redis.
async fn the_ledger_lag_counts_every_entry_committed_in_sql(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    app.must_create_policy(calendar_policy("p", "a", 100, "day", "UTC"))
        .await;
    for i in 0..5 {
        let answer = app.consume("a", &format!("s-{i}"), 1).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    crate::helpers::eventually(
        std::time::Duration::from_secs(10),
        "5 entries counted in quota_ledger_lag_seconds",
        || async {
            let text = app.metrics_text().await;
            let count = text
                .lines()
                .find_map(|l| l.strip_prefix("quota_ledger_lag_seconds_count "))
                .and_then(|n| n.trim().parse::<u64>().ok());
            (count == Some(5)).then_some(())
        },
    )
    .await;
}

crate::on_counter_stores!(the_ledger_lag_counts_every_entry_committed_in_sql);
