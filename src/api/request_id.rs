//! Request ids and the access log: each request runs inside a tracing span carrying its
//! id, so every log line it causes can be found again, and the id is echoed to the caller.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use std::time::Instant;
use tracing::Instrument;

/// The header carrying the request id, in both directions.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id taken from a caller.
const MAX_LEN: usize = 128;

/// The caller's `X-Request-Id` if it is 1-128 printable ASCII characters, else a new UUID.
fn request_id(req: &ServiceRequest) -> String {
    req.headers()
        .get(REQUEST_ID)
        .map(HeaderValue::as_bytes)
        .filter(|id| {
            (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| (b' '..=b'~').contains(b))
        })
        .and_then(|id| std::str::from_utf8(id).ok())
        .map_or_else(new_id, str::to_owned)
}

/// A new request id: a random UUID, hyphenated, lower case.
fn new_id() -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    String::from(&*uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buffer))
}

/// Middleware (for `actix_web::middleware::from_fn`; wrap it outermost): runs the request
/// in a `request` span with its `request_id`, sets `X-Request-Id` on every answer (errors
/// and 404s included: the inner services answer them as responses) and logs one line per
/// request.
///
/// The line names the route pattern (`/admin/policies/{id}/overrides/{subject}`), never
/// the path as sent nor the query string, since either may hold a subject; headers (and
/// so tokens) are never logged.
pub(crate) async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let id = request_id(&req);
    let method = req.method().clone();
    // ERROR level so that the span is enabled under any filter: a `warn` line of the
    // request still carries its id when RUST_LOG=warn.
    let span = match crate::telemetry::exporting() {
        false => tracing::error_span!("request", request_id = %id),
        true => traced_span(&req, &id),
    };
    let log = |route: Option<&str>, status: u16| {
        span.in_scope(|| {
            tracing::info!(
                method = %method,
                path = route.unwrap_or("(no route)"),
                status,
                latency_ms = started.elapsed().as_micros() as f64 / 1e3,
                "request answered"
            );
        });
    };
    match next.call(req).instrument(span.clone()).await {
        Ok(mut response) => {
            if let Ok(value) = HeaderValue::from_str(&id) {
                response.headers_mut().insert(REQUEST_ID, value);
            }
            let route = response.request().match_pattern();
            let status = response.status().as_u16();
            log(route.as_deref(), status);
            if crate::telemetry::exporting() {
                span.record("http.response.status_code", i64::from(status));
                if status >= 500 {
                    span.record("otel.status_code", "ERROR");
                }
            }
            Ok(response)
        }
        // Not expected (errors are answered as responses inside); actix renders it, and
        // without the request at hand the id cannot be attached, but it is logged.
        Err(error) => {
            log(None, error.as_response_error().status_code().as_u16());
            Err(error)
        }
    }
}

/// The request's span when traces are exported: named after the route, with the
/// attributes of an HTTP server span, a child of the caller's trace when the request
/// carries a W3C `traceparent`, and its `trace_id` for the log lines.
fn traced_span(req: &ServiceRequest, id: &str) -> tracing::Span {
    let route = req.match_pattern();
    let name = format!(
        "{} {}",
        req.method(),
        route.as_deref().unwrap_or("(no route)")
    );
    let span = tracing::error_span!(
        "request",
        request_id = %id,
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %req.method(),
        http.route = route.as_deref().unwrap_or(""),
        http.response.status_code = tracing::field::Empty,
        decision = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    let headers = req
        .headers()
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    let trace_id = crate::telemetry::adopt_parent(&span, headers);
    span.record("trace_id", trace_id.as_str());
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn only_short_printable_ascii_ids_are_taken_from_the_caller() {
        let given = |value: &[u8]| {
            let header = HeaderValue::from_bytes(value).expect("a valid header value");
            request_id(
                &TestRequest::default()
                    .insert_header((REQUEST_ID, header))
                    .to_srv_request(),
            )
        };
        for ok in ["a", "req-42", "with space", &"x".repeat(128), "!~"] {
            assert_eq!(given(ok.as_bytes()), ok);
        }
        for bad in [&b"x".repeat(129)[..], b"tab\there", "é".as_bytes(), b""] {
            let id = given(bad);
            assert!(uuid::Uuid::parse_str(&id).is_ok(), "{bad:?} gave {id}");
        }
        let fresh = request_id(&TestRequest::default().to_srv_request());
        assert!(uuid::Uuid::parse_str(&fresh).is_ok());
    }
}
