//! Traces: the binary exports its spans over OTLP (HTTP, protobuf) to a receiver this test
//! runs, continues the caller's W3C trace, and puts the trace id in its JSON log lines.

use crate::helpers::{
    calendar_policy, eventually, free_port, fresh_settings, CounterBackend, PolicyBackend, Service,
    ADMIN_TOKEN,
};
use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An OTLP/HTTP receiver on a free port: every span it was sent.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Receiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let port = free_port();
        let server = HttpServer::new(move || {
            let kept = kept.clone();
            App::new().route(
                "/v1/traces",
                web::post().to(move |body: web::Bytes| {
                    let kept = kept.clone();
                    async move {
                        let request =
                            ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                        let mut kept = kept.lock().unwrap();
                        for resource in request.resource_spans {
                            for scope in resource.scope_spans {
                                kept.extend(scope.spans);
                            }
                        }
                        HttpResponse::Ok()
                            .content_type("application/x-protobuf")
                            .body(Vec::new())
                    }
                }),
            )
        })
        .workers(1)
        .bind(("127.0.0.1", port))
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            handle,
        }
    }

    /// The first span named `name` received within 10 s.
    async fn span(&self, name: &str) -> Span {
        self.child(name, None).await
    }

    /// The first span named `name` (and whose parent is `parent`, if given) received
    /// within 10 s.
    async fn child(&self, name: &str, parent: Option<&Span>) -> Span {
        eventually(Duration::from_secs(10), name, || {
            let found = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|s| s.name == name && parent.is_none_or(|p| s.parent_span_id == p.span_id))
                .cloned();
            async move { found }
        })
        .await
    }
}

fn attribute(span: &Span, key: &str) -> Option<Any> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone()?.value)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn traces_with(counters: CounterBackend, store_span: &str) {
    let receiver = Receiver::start().await;
    let settings = fresh_settings(PolicyBackend::Sqlite, counters).await;
    let port = free_port();
    let log = std::env::temp_dir().join(format!("ql-traces-{}.log", uuid::Uuid::new_v4()));
    let service = Service::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"))
            .env("QUOTA_LISTEN", format!("127.0.0.1:{port}"))
            .env("DATABASE_URL", &settings.database_url)
            .env("REDIS_URL", settings.redis_urls.join(","))
            .env("QUOTA_REDIS_PREFIX", &settings.redis_prefix)
            .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("QUOTA_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null()),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually(Duration::from_secs(10), "the binary answering", || async {
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .map(drop)
    })
    .await;
    let created = client
        .post(format!("{base}/admin/policies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&calendar_policy("p", "sms", 100, "day", "UTC"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let consumed = client
        .post(format!("{base}/quota/consume"))
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .json(&serde_json::json!({"action": "sms", "subject": "u-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(consumed.status(), 200);
    let ledger = client
        .get(format!("{base}/quota/ledger?subject=u-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(ledger.status(), 200);

    let request = receiver.span("POST /quota/consume").await;
    assert_eq!(
        hex(&request.trace_id),
        trace,
        "the caller's trace continues"
    );
    assert_eq!(hex(&request.parent_span_id), parent);
    assert_eq!(
        attribute(&request, "http.route"),
        Some(Any::StringValue("/quota/consume".into()))
    );
    assert_eq!(
        attribute(&request, "http.response.status_code"),
        Some(Any::IntValue(200))
    );
    assert_eq!(
        attribute(&request, "decision"),
        Some(Any::StringValue("allowed".into()))
    );
    // The store call made for the request is its child (found by parent, within 10 s).
    let store = receiver.child(store_span, Some(&request)).await;
    assert_eq!(store.trace_id, request.trace_id);
    let listing = receiver.span("GET /quota/ledger").await;
    receiver.child("sql ledger page", Some(&listing)).await;
    let admin = receiver.span("POST /admin/policies").await;
    receiver
        .child("sql policy insert_policy", Some(&admin))
        .await;
    // Background work (the drain's and the sweeper's Redis calls) exports no spans.
    let roots: Vec<String> = receiver
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.parent_span_id.is_empty() && s.name.starts_with("redis"))
        .map(|s| s.name.clone())
        .collect();
    assert!(roots.is_empty(), "spans outside requests: {roots:?}");

    drop(service);
    let lines = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let answered = lines
        .lines()
        .filter(|l| l.contains("request answered") && l.contains("/quota/consume"))
        .collect::<Vec<_>>();
    assert!(
        answered
            .iter()
            .any(|l| l.contains(&format!("\"trace_id\":\"{trace}\""))),
        "the request's log line carries its trace id: {answered:?}"
    );
    receiver.handle.stop(false).await;
}

#[tokio::test]
async fn spans_reach_an_otlp_receiver_on_the_embedded_default() {
    traces_with(CounterBackend::Memory, "sql ledger insert (group commit)").await;
}

#[tokio::test]
async fn spans_reach_an_otlp_receiver_on_redis() {
    traces_with(CounterBackend::Redis, "redis EVALSHA").await;
}
