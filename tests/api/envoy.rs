//! Envoy's rate limit service over gRPC, called through the client generated from Envoy's
//! own `rls.proto` (the `envoy-types` crate), on every counter store.

use crate::helpers::{
    app_with, free_port, fresh_settings, spawn_with, CounterBackend, PolicyBackend, TestApp,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use quota_ledger::config::{OnStoreError, Secret};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tonic::transport::Channel;

/// A client of `app`'s rate limit service.
async fn client(app: &TestApp) -> RateLimitServiceClient<Channel> {
    let address = app.grpc.clone().expect("the test settings serve gRPC");
    RateLimitServiceClient::connect(address)
        .await
        .expect("connecting to the gRPC service")
}

/// A descriptor of `entries`, with its own `hits_addend` if given.
fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

/// Usage of `policy` in the budget `attributes` (query pairs) of `action`.
async fn used(app: &TestApp, action: &str, subject: &str, query: &str, policy: &str) -> Value {
    let answer = app
        .send(app.client.get(format!(
            "{}/quota/usage?action={action}&subject={subject}&{query}",
            app.address
        )))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let policies = answer.body["policies"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    policies
        .into_iter()
        .find(|p| p["policy_id"] == policy)
        .map_or(Value::Null, |p| p["used"].clone())
}

/// A gateway's two limits: per API key (descriptors `generic_key=per-key, api_key=…`) and
/// per client address (`generic_key=per-ip, remote_address=…`), each a calendar day.
fn gateway_policies(per_key: u64, per_ip: u64) -> Vec<Value> {
    let day = json!({"type": "calendar", "period": "day", "timezone": "UTC"});
    vec![
        json!({"id": "per-key", "action": "gateway", "measure": "count", "limit": per_key,
            "scope": ["api_key"], "match": {"generic_key": ["per-key"]}, "window": day}),
        json!({"id": "per-ip", "action": "gateway", "measure": "count", "limit": per_ip,
            "scope": ["remote_address"], "match": {"generic_key": ["per-ip"]}, "window": day}),
    ]
}

fn key(api_key: &str) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "per-key"), ("api_key", api_key)], None)
}

fn ip(address: &str) -> RateLimitDescriptor {
    descriptor(
        &[("generic_key", "per-ip"), ("remote_address", address)],
        None,
    )
}

async fn when_one_descriptor_is_over_nothing_is_charged_on_the_others(counters: CounterBackend) {
    let app = app_with(counters, &gateway_policies(10, 1)).await;
    let mut grpc = client(&app).await;
    let first = ask(
        &mut grpc,
        request("gateway", vec![key("k1"), ip("10.0.0.1")], 0),
    )
    .await
    .unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses.len(), 2);
    assert_eq!(first.statuses[0].limit_remaining, 9);
    assert_eq!(first.statuses[1].limit_remaining, 0);

    // The address is over its limit of 1: nothing is charged, the key included.
    let second = ask(
        &mut grpc,
        request("gateway", vec![key("k1"), ip("10.0.0.1")], 0),
    )
    .await
    .unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert_eq!(
        second.statuses[0].code,
        Code::Ok as i32,
        "the key alone is fine"
    );
    assert_eq!(second.statuses[0].limit_remaining, 9, "and was not charged");
    assert_eq!(second.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        used(
            &app,
            "gateway",
            "-",
            "api_key=k1&generic_key=per-key",
            "per-key"
        )
        .await,
        json!(1)
    );

    // Each descriptor is a ledger entry of its own; the denied request charged nothing.
    app.engine.drain_ledger_now().await;
    let ledger = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?action=gateway", app.address)),
        )
        .await;
    let items = ledger.body["items"].as_array().cloned().unwrap_or_default();
    let charges: Vec<&Value> = items.iter().filter(|e| e["kind"] == "charge").collect();
    assert_eq!(charges.len(), 2, "{items:?}");
    assert!(charges
        .iter()
        .any(|e| e["subject"] == "generic_key=per-ip,remote_address=10.0.0.1"));

    // /metrics counts each call as one decision of its domain.
    let text = app.metrics_text().await;
    for result in ["allowed", "denied"] {
        let series = format!(
            "quota_requests_total{{endpoint=\"should_rate_limit\",action=\"gateway\",result=\"{result}\"}} 1"
        );
        assert!(text.contains(&series), "{series} in\n{text}");
    }
}

async fn statuses_carry_the_limit_its_unit_what_remains_and_the_time_to_reset(
    counters: CounterBackend,
) {
    let app = app_with(counters, &gateway_policies(100, 100)).await;
    let mut grpc = client(&app).await;
    let answer = ask(&mut grpc, request("gateway", vec![key("k")], 0))
        .await
        .unwrap();
    let status = &answer.statuses[0];
    let limit = status.current_limit.as_ref().expect("a limit applies");
    assert_eq!(limit.requests_per_unit, 100);
    assert_eq!(limit.unit, Unit::Day as i32);
    assert_eq!(limit.name, "per-key");
    assert_eq!(status.limit_remaining, 99);
    // The test clock stands at 12:00 UTC: the day ends in 12 hours.
    let reset = status.duration_until_reset.as_ref().expect("a reset");
    assert_eq!(reset.seconds, 12 * 3_600);
}

async fn hits_addend_is_the_amount_and_a_descriptors_own_wins(counters: CounterBackend) {
    let policy = json!({"id": "bytes", "action": "upload", "measure": "amount", "limit": 1000,
        "scope": ["tenant"], "window": {"type": "calendar", "period": "day", "timezone": "UTC"}});
    let app = app_with(counters, &[policy]).await;
    let mut grpc = client(&app).await;
    let tenant = |hits| descriptor(&[("tenant", "acme")], hits);
    // The request's hits_addend (600) counts for a descriptor without its own.
    let first = ask(&mut grpc, request("upload", vec![tenant(None)], 600))
        .await
        .unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses[0].limit_remaining, 400);
    // The descriptor's own (500) wins over the request's (1): over the limit.
    let second = ask(&mut grpc, request("upload", vec![tenant(Some(500))], 1))
        .await
        .unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert_eq!(second.statuses[0].limit_remaining, 400, "nothing charged");
    // Unset or 0 counts as 1, as a stock Envoy sends it.
    let third = ask(&mut grpc, request("upload", vec![tenant(Some(0))], 0))
        .await
        .unwrap();
    assert_eq!(third.statuses[0].limit_remaining, 399);
}

async fn three_hundred_concurrent_calls_allow_exactly_the_limit(counters: CounterBackend) {
    let app = app_with(counters, &gateway_policies(100, 1_000_000)).await;
    let grpc = client(&app).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let mut grpc = grpc.clone();
        let address = format!("10.0.{}.{}", i / 250, i % 250);
        tasks.spawn(async move {
            ask(
                &mut grpc,
                request("gateway", vec![key("shared"), ip(&address)], 0),
            )
            .await
        });
    }
    let mut allowed = 0;
    while let Some(answer) = tasks.join_next().await {
        let answer = answer.unwrap().expect("every call is answered");
        if answer.overall_code == Code::Ok as i32 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 100, "exactly the limit");
    assert_eq!(
        used(
            &app,
            "gateway",
            "-",
            "api_key=shared&generic_key=per-key",
            "per-key"
        )
        .await,
        json!(100)
    );
}

async fn bad_input_is_invalid_argument_with_a_clear_message(counters: CounterBackend) {
    let app = app_with(counters, &gateway_policies(10, 10)).await;
    let mut grpc = client(&app).await;
    let cases = [
        (
            request("nobody-limits-this", vec![key("k")], 0),
            "no policy limits",
        ),
        (request("gateway", vec![], 0), "no descriptors"),
        (
            request("gateway", vec![key("k"), descriptor(&[], None)], 0),
            "descriptors[1]: no entries",
        ),
        (
            // The per-ip policy applies (its match holds) but its scope entry is missing.
            request(
                "gateway",
                vec![descriptor(&[("generic_key", "per-ip")], None)],
                0,
            ),
            "descriptors[0].attributes.remote_address",
        ),
        (
            request("gateway", vec![descriptor(&[("Bad-Key", "v")], None)], 0),
            "descriptors[0]: entries: 'Bad-Key' is not a key",
        ),
        (
            request("gateway", vec![key(&"x".repeat(100_000))], 0),
            "at most 65536",
        ),
        (
            request("gateway", (0..33).map(|i| key(&i.to_string())).collect(), 0),
            "at most 32",
        ),
    ];
    for (bad, says) in cases {
        let status = ask(&mut grpc, bad).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{says:?} in {status:?}");
    }
    // Nothing was charged by any of them.
    assert_eq!(
        used(
            &app,
            "gateway",
            "-",
            "api_key=k&generic_key=per-key",
            "per-key"
        )
        .await,
        json!(0)
    );
}

/// Descriptors decided together alert as consumes do: one event per crossing, a counter
/// two descriptors of one call share crossing once, with the usage of the whole call.
async fn descriptors_decided_together_alert_once_per_crossing(counters: CounterBackend) {
    let mut policies = gateway_policies(4, 10);
    policies[0]["alert_thresholds"] = json!([50, 100]);
    let app = app_with(counters, &policies).await;
    let mut grpc = client(&app).await;
    for (call, descriptors, code) in [
        // k1 goes 0 -> 2 in one call: 50% once.
        (1, vec![key("k1"), key("k1")], Code::Ok),
        (2, vec![key("k1"), key("k2")], Code::Ok),
        // k1 3 -> 4: 100%; k2 1 -> 2: 50%; the address alerts on nothing.
        (3, vec![key("k1"), ip("10.0.0.1"), key("k2")], Code::Ok),
        // Denied: charges nothing, crosses nothing.
        (4, vec![key("k1"), key("k2")], Code::OverLimit),
    ] {
        let answer = ask(&mut grpc, request("gateway", descriptors, 0)).await;
        let answer = answer.unwrap_or_else(|status| panic!("call {call}: {status}"));
        assert_eq!(answer.overall_code, code as i32, "call {call}: {answer:?}");
    }
    let events = crate::alerts::outbox(&app).await;
    let mut seen: Vec<(Value, Value, Value, Value)> = events
        .iter()
        .map(|(kind, p)| {
            assert_eq!(kind, "budget.threshold", "{p}");
            assert_eq!(p["action"], "gateway", "{p}");
            let budget = p["budget"]["api_key"].clone();
            (
                budget,
                p["threshold"].clone(),
                p["used"].clone(),
                p["limit"].clone(),
            )
        })
        .collect();
    seen.sort_by_key(|s| s.0.to_string() + &s.1.to_string());
    assert_eq!(
        seen,
        vec![
            (json!("k1"), json!(100), json!(4), json!(4)),
            (json!("k1"), json!(50), json!(2), json!(4)),
            (json!("k2"), json!(50), json!(2), json!(4)),
        ],
        "{events:?}"
    );
    let ids: std::collections::BTreeSet<String> =
        events.iter().map(|(_, p)| p["id"].to_string()).collect();
    assert_eq!(ids.len(), 3, "one id per crossing: {events:?}");
}

crate::on_counter_stores!(
    descriptors_decided_together_alert_once_per_crossing,
    when_one_descriptor_is_over_nothing_is_charged_on_the_others,
    statuses_carry_the_limit_its_unit_what_remains_and_the_time_to_reset,
    hits_addend_is_the_amount_and_a_descriptors_own_wins,
    three_hundred_concurrent_calls_allow_exactly_the_limit,
    bad_input_is_invalid_argument_with_a_clear_message,
);

#[tokio::test]
async fn the_grpc_health_service_answers_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let app = app_with(CounterBackend::Memory, &[]).await;
    let channel = Channel::from_shared(app.grpc.clone().unwrap())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn with_client_tokens_the_bearer_token_is_required_as_metadata() {
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.client_tokens = vec![Secret::new("gateway-token")];
    let app = spawn_with(settings).await;
    for policy in gateway_policies(10, 10) {
        app.must_create_policy(policy).await;
    }
    let mut grpc = client(&app).await;
    let without = ask(&mut grpc, request("gateway", vec![key("k")], 0))
        .await
        .expect_err("refused");
    assert_eq!(without.code(), tonic::Code::Unauthenticated);
    let mut wrong = tonic::Request::new(request("gateway", vec![key("k")], 0));
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    let wrong = grpc.should_rate_limit(wrong).await.expect_err("refused");
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    let mut right = tonic::Request::new(request("gateway", vec![key("k")], 0));
    right
        .metadata_mut()
        .insert("authorization", "Bearer gateway-token".parse().unwrap());
    let right = grpc.should_rate_limit(right).await.unwrap().into_inner();
    assert_eq!(right.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn an_api_key_outside_its_domain_is_permission_denied() {
    let app = app_with(CounterBackend::Memory, &gateway_policies(10, 10)).await;
    let mut other = gateway_policies(10, 10);
    for policy in &mut other {
        policy["id"] = json!(format!("sms-{}", policy["id"].as_str().unwrap()));
        policy["action"] = json!("sms.send");
    }
    for policy in other {
        app.must_create_policy(policy).await;
    }
    let created =
        app.send(app.admin(reqwest::Method::POST, "/admin/keys").json(
            &json!({"name": "sms gateway", "actions": ["sms.*"], "operations": ["consume"]}),
        ))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let bearer = format!("Bearer {}", created.body["key"].as_str().unwrap());
    let mut grpc = client(&app).await;
    let with_key = |domain: &str| {
        let mut request = tonic::Request::new(request(domain, vec![key("k")], 0));
        request
            .metadata_mut()
            .insert("authorization", bearer.parse().unwrap());
        request
    };
    let allowed = grpc
        .should_rate_limit(with_key("sms.send"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.overall_code, Code::Ok as i32);
    let denied = grpc
        .should_rate_limit(with_key("gateway"))
        .await
        .expect_err("outside the key's actions");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("gateway"), "{denied:?}");
    let without = ask(&mut grpc, request("sms.send", vec![key("k")], 0))
        .await
        .expect_err("the first key closed the endpoints");
    assert_eq!(without.code(), tonic::Code::Unauthenticated);
}

/// Settings with Redis on a loopback port where nothing listens.
async fn with_dead_redis(on_error: OnStoreError) -> TestApp {
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Redis).await;
    settings.redis_urls = vec![format!("redis://127.0.0.1:{}/", free_port())];
    settings.redis_timeout = std::time::Duration::from_millis(200);
    settings.on_store_error = on_error;
    let app = spawn_with(settings).await;
    for policy in gateway_policies(10, 10) {
        app.must_create_policy(policy).await;
    }
    app
}

#[tokio::test]
async fn with_the_counter_store_down_the_answer_follows_quota_on_store_error() {
    let closed = with_dead_redis(OnStoreError::Deny).await;
    let status = ask(
        &mut client(&closed).await,
        request("gateway", vec![key("k")], 0),
    )
    .await
    .expect_err("fails closed");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let open = with_dead_redis(OnStoreError::Allow).await;
    let answer = ask(
        &mut client(&open).await,
        request("gateway", vec![key("k")], 0),
    )
    .await
    .expect("fails open");
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

/// The README's example: the policies of `examples/gateway-policies.yaml`, asked with the
/// two descriptors `examples/envoy.yaml` makes Envoy send for each request.
#[tokio::test]
async fn the_readme_gateway_example_limits_per_key_and_per_address() {
    let file: Value = yaml_serde::from_str(include_str!("../../examples/gateway-policies.yaml"))
        .expect("the example parses");
    let policies = file["policies"].as_array().cloned().unwrap_or_default();
    assert_eq!(policies.len(), 2);
    let app = app_with(CounterBackend::Memory, &policies).await;
    let mut grpc = client(&app).await;
    let from = |address: &str| request("gateway", vec![key("k-1"), ip(address)], 0);
    let first = ask(&mut grpc, from("192.0.2.7")).await.unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    let per_key = first.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (per_key.requests_per_unit, per_key.unit),
        (1000, Unit::Hour as i32)
    );
    let per_ip = first.statuses[1].current_limit.clone().unwrap();
    assert_eq!(
        (per_ip.requests_per_unit, per_ip.unit),
        (100, Unit::Minute as i32)
    );
    for _ in 1..100 {
        assert_eq!(
            ask(&mut grpc, from("192.0.2.7"))
                .await
                .unwrap()
                .overall_code,
            Code::Ok as i32
        );
    }
    // The address's 101st request in the minute is over; another address is not.
    let over = ask(&mut grpc, from("192.0.2.7")).await.unwrap();
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(over.statuses[1].code, Code::OverLimit as i32);
    let other = ask(&mut grpc, from("192.0.2.8")).await.unwrap();
    assert_eq!(other.overall_code, Code::Ok as i32);
    assert_eq!(
        other.statuses[0].limit_remaining,
        1000 - 101,
        "the key's 101st"
    );
}

/// Descriptors decided together whose entries the ledger refuses: the call fails as
/// UNAVAILABLE and charges none of them; once the ledger is back, they are decided afresh.
#[tokio::test]
async fn descriptors_whose_entries_the_ledger_refuses_are_charged_nowhere() {
    let app = app_with(CounterBackend::Memory, &gateway_policies(10, 10)).await;
    let mut grpc = client(&app).await;
    let both = || request("gateway", vec![key("k1"), ip("10.0.0.1")], 0);
    assert_eq!(
        ask(&mut grpc, both()).await.unwrap().overall_code,
        Code::Ok as i32
    );
    let refusal = crate::integrity::Refusal::install(&app.settings.database_url).await;
    let status = ask(&mut grpc, both())
        .await
        .expect_err("the ledger refuses");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let query = "attributes[api_key]=k1&attributes[generic_key]=per-key";
    let key_used = used(&app, "gateway", "-", query, "per-key").await;
    assert_eq!(key_used, json!(1), "the refused call charged nothing");
    refusal.lift().await;
    let again = ask(&mut grpc, both()).await.unwrap();
    assert_eq!(again.statuses[0].limit_remaining, 8);
    assert_eq!(again.statuses[1].limit_remaining, 8);
    crate::integrity::assert_no_drift(&app).await;
}

#[tokio::test]
async fn a_lifetime_and_a_per_request_maximum_have_no_unit_and_a_lifetime_no_reset() {
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.ledger_retention_days = None;
    let app = crate::helpers::spawn_with(settings).await;
    for (id, window) in [("per-call", "request"), ("all-time", "lifetime")] {
        app.must_create_policy(json!({"id": id, "action": id, "measure": "amount",
            "limit": 1000, "scope": ["tenant"], "window": {"type": window}}))
            .await;
    }
    let mut grpc = client(&app).await;
    for (domain, has_reset) in [("per-call", true), ("all-time", false)] {
        let tenant = descriptor(&[("tenant", "acme")], Some(600));
        let answer = ask(&mut grpc, request(domain, vec![tenant], 0))
            .await
            .unwrap();
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("a limit applies");
        assert_eq!(
            (limit.name.as_str(), limit.unit),
            (domain, Unit::Unknown as i32)
        );
        assert_eq!(status.duration_until_reset.is_some(), has_reset, "{domain}");
    }
}
