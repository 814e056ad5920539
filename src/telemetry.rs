//! Logs and traces: the process's `tracing` subscriber.
//!
//! Log lines go to standard output (text, or JSON with `QUOTA_LOG_FORMAT=json`), filtered
//! by `RUST_LOG`. With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, spans are also exported over OTLP (HTTP, protobuf) in batches: one span per
//! request (route, status, decision), and child spans for the Redis and SQL calls made for
//! it, which are `trace`-level spans of this crate. A W3C `traceparent` on a request makes
//! its span a child of the caller's, and the request's log lines carry its `trace_id`.
//! Unset, nothing is exported and the child spans are disabled at their call sites: the
//! hot path pays one relaxed atomic load per request.

use anyhow::Context;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter, EnvFilter, Layer};

/// The variables that turn the export on (either one).
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// Whether spans are exported (so request spans carry the trace attributes).
pub fn exporting() -> bool {
    crate::logs::spans_exported()
}

/// Keeps the exporter; [`Telemetry::shutdown`] sends the spans still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the exporter (at most its export timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(error) = provider.shutdown() {
                eprintln!("exporting the last spans failed: {error}");
            }
        }
    }
}

/// Installs the process's subscriber: log lines (`json` or text, `RUST_LOG`, default
/// `info`), and the OTLP span export when its endpoint is set.
pub fn init(json: bool) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let wanted = ENDPOINT_VARIABLES
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|value| !value.trim().is_empty()));
    if !wanted {
        // One global filter, as before traces existed: no per-layer filtering on the hot
        // path.
        let lines = tracing_subscriber::fmt().with_env_filter(filter);
        match json {
            true => lines.json().init(),
            false => lines.init(),
        }
        return Ok(Telemetry::default());
    }
    let lines = match json {
        true => tracing_subscriber::fmt::layer().json().boxed(),
        false => tracing_subscriber::fmt::layer().boxed(),
    }
    .with_filter(filter);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .context("building the OTLP span exporter (OTEL_EXPORTER_OTLP_ENDPOINT)")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "quota-ledger".to_owned()),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // Spans only (log lines are not copied into traces), and only this crate's.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("quota-ledger"))
        .with_filter(filter::filter_fn(|meta| {
            meta.is_span() && meta.target().starts_with("quota_ledger")
        }));
    tracing_subscriber::registry()
        .with(lines)
        .with(spans)
        .init();
    crate::logs::export_spans();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// Makes `span` a child of the caller's trace when `headers` carry a W3C `traceparent`,
/// and returns the span's trace id (hex) for the log lines.
pub fn adopt_parent<'a>(
    span: &tracing::Span,
    headers: impl Iterator<Item = (&'a str, &'a str)>,
) -> String {
    let carrier = Headers(headers.collect());
    let parent =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
    // Without a valid parent the span starts a trace of its own.
    let _ = span.set_parent(parent);
    span.context().span().span_context().trace_id().to_string()
}

/// Request headers, as the propagator reads them.
struct Headers<'a>(Vec<(&'a str, &'a str)>);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| *value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| *name).collect()
    }
}
