//! Envoy's rate limit service over gRPC: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, so that Envoy, Istio or any gateway with an RLS client enforces the
//! policies, and the standard gRPC health service beside it.
//!
//! The mapping (docs/envoy.md shows it with an Envoy configuration):
//! - `domain` is the action; an action without policies is `INVALID_ARGUMENT`, never `OK`.
//! - Each descriptor is one consume: its entry keyed `subject` is the subject, the others
//!   are attributes (so policies scoped or matched by `remote_address`, `generic_key`,
//!   `header_match` or any `descriptor_key` apply). A descriptor without a `subject` entry
//!   is recorded under its entries' text, and a policy whose scope names the subject cannot
//!   apply to it.
//! - The amount is the descriptor's own `hits_addend` if set, else the request's; unset or
//!   0 counts as 1 (what a stock Envoy sends). `count` policies count 1 per descriptor.
//! - Every descriptor of one request is decided at once ([`Engine::consume_together`]):
//!   all charged, or none. The answer is `OVER_LIMIT` when any is denied, with one status
//!   per descriptor.
//! - Bad input is `INVALID_ARGUMENT` with a message that names the descriptor.
//! - A counter store that is down is `UNAVAILABLE`, or `OK` with `QUOTA_ON_STORE_ERROR=allow`
//!   (the engine's degraded allow).
//! - Once a client token or an API key exists, the `authorization: Bearer <token or key>`
//!   metadata is required (`UNAUTHENTICATED` without a known one). A key needs the
//!   `consume` operation, and a `domain` outside its actions is `PERMISSION_DENIED`.

use crate::access::{Denial, Gate, Operation};
use crate::admission::Admission;
use crate::domain::{Action, Attributes, FieldErrors, Mode, Quantity, Subject};
use crate::engine::{ConsumeRequest, Decision, Engine, EngineError, PolicyDecision};
use crate::metrics::{Endpoint, Metrics};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::net::SocketAddr;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The most descriptors one request may carry.
const MAX_DESCRIPTORS: usize = 32;

/// The largest request accepted, encoded (bytes): far above what a gateway sends.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The most requests one connection may have in flight (a gateway multiplexes many).
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 1_024;

/// The descriptor entry that names the subject.
const SUBJECT_ENTRY: &str = "subject";

/// Answers `ShouldRateLimit` with the engine.
pub struct RateLimiter {
    engine: Arc<Engine>,
    /// Shared with the HTTP API's `/quota/*`: one bound on what the instance serves at once,
    /// so that a flood over gRPC is shed too, never taken for a store outage.
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
    /// Who may call: the client tokens and the API keys.
    gate: Arc<Gate>,
}

impl RateLimiter {
    /// A rate limit service over `engine`, admitted by `admission`, recorded in `metrics`,
    /// letting in whom `gate` admits.
    pub(crate) fn new(
        engine: Arc<Engine>,
        admission: Arc<Admission>,
        metrics: Arc<Metrics>,
        gate: Arc<Gate>,
    ) -> Self {
        Self {
            engine,
            admission,
            metrics,
            gate,
        }
    }

    /// Whether `metadata` may consume on `domain`: `UNAUTHENTICATED` without a known
    /// token or key, `PERMISSION_DENIED` for a key without `consume` or outside its actions.
    fn authorize(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        domain: &str,
    ) -> Result<(), Status> {
        let token = metadata
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let refused = |denial: Denial| {
            self.metrics.auth_refused(denial.reason());
            match denial {
                Denial::Unauthenticated(_) => Status::unauthenticated(
                    "a known client token or API key is required: authorization: Bearer <token or key>",
                ),
                Denial::Forbidden(why) => Status::permission_denied(why),
            }
        };
        let actions = self
            .gate
            .admit(token, Operation::Consume)
            .map_err(refused)?;
        match actions.contains_str(domain) {
            true => Ok(()),
            false => Err(refused(Denial::Forbidden(format!(
                "this API key may not act on the domain (action) '{domain}'"
            )))),
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.authorize(request.metadata(), &request.get_ref().domain)?;
        let request = request.into_inner();
        let consumes = consumes_of(&request)?;
        let _slot = self.admission.admit().await.map_err(|_| {
            Status::unavailable(
                "the service is overloaded (too many requests in flight); retry shortly",
            )
        })?;
        let started = std::time::Instant::now();
        let decided = self.engine.decider().consume_together(&consumes).await;
        self.metrics.observe_together(
            Endpoint::RateLimit,
            &request.domain,
            started.elapsed(),
            decided.as_deref(),
        );
        let decisions = decided.map_err(|error| status_of(&request.domain, &error))?;
        Ok(Response::new(response_of(&decisions)))
    }
}

/// The consumes `request` asks for, one per descriptor; `INVALID_ARGUMENT` naming what is
/// wrong otherwise.
fn consumes_of(request: &RateLimitRequest) -> Result<Vec<ConsumeRequest>, Status> {
    use prost::Message;
    let size = request.encoded_len();
    if size > MAX_REQUEST_BYTES {
        return Err(Status::invalid_argument(format!(
            "the request is {size} bytes: at most {MAX_REQUEST_BYTES}"
        )));
    }
    let action = Action::parse("domain", &request.domain)
        .map_err(|error| Status::invalid_argument(error.to_string()))?;
    match request.descriptors.len() {
        0 => {
            return Err(Status::invalid_argument(
                "no descriptors: at least one is required",
            ))
        }
        n if n > MAX_DESCRIPTORS => {
            return Err(Status::invalid_argument(format!(
                "{n} descriptors: at most {MAX_DESCRIPTORS}"
            )))
        }
        _ => {}
    }
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| consume_of(&action, request.hits_addend, descriptor, i))
        .collect()
}

/// Descriptor `i` of a request for `action` whose own `hits_addend` is `hits`.
fn consume_of(
    action: &Action,
    hits: u32,
    descriptor: &RateLimitDescriptor,
    i: usize,
) -> Result<ConsumeRequest, Status> {
    let invalid = |what: String| Status::invalid_argument(format!("descriptors[{i}]: {what}"));
    if descriptor.entries.is_empty() {
        return Err(invalid("no entries: at least one is required".to_owned()));
    }
    if descriptor.is_negative_hits {
        return Err(invalid(
            "negative hits are not supported: give units back with POST /quota/refund".to_owned(),
        ));
    }
    let amount = match descriptor.hits_addend.as_ref().map(|h| h.value) {
        Some(own) if own > 0 => own,
        _ => u64::from(hits.max(1)),
    };
    let amount = Quantity::parse_amount("hits_addend", i128::from(amount))
        .map_err(|error| invalid(error.to_string()))?;
    let mut subject = None;
    let mut pairs = Vec::with_capacity(descriptor.entries.len());
    for entry in &descriptor.entries {
        if entry.key == SUBJECT_ENTRY {
            if subject.is_some() {
                return Err(invalid("two 'subject' entries".to_owned()));
            }
            subject = Some(
                Subject::parse("subject", &entry.value)
                    .map_err(|error| invalid(error.to_string()))?,
            );
        } else {
            if pairs
                .iter()
                .any(|(key, _): &(String, String)| *key == entry.key)
            {
                return Err(invalid(format!("two '{}' entries", entry.key)));
            }
            pairs.push((entry.key.clone(), entry.value.clone()));
        }
    }
    let text = descriptor_text(descriptor);
    let attributes =
        Attributes::parse("entries", pairs).map_err(|errors| invalid(message_of(&errors)))?;
    let anonymous = subject.is_none();
    let subject = match subject {
        Some(subject) => subject,
        None => Subject::parse("entries", &text).map_err(|error| invalid(error.to_string()))?,
    };
    Ok(ConsumeRequest {
        action: action.clone(),
        subject,
        amount,
        idempotency_key: None,
        attributes,
        anonymous,
    })
}

/// `key=value,key=value`, cut to a subject's 256 bytes: how a descriptor without a
/// `subject` entry is named in the ledger.
fn descriptor_text(descriptor: &RateLimitDescriptor) -> String {
    let mut text = String::new();
    for entry in &descriptor.entries {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(&entry.key);
        text.push('=');
        text.push_str(&entry.value);
    }
    let mut end = text.len().min(Subject::MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// Field errors as one line.
fn message_of(errors: &FieldErrors) -> String {
    errors
        .0
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The gRPC status of an engine error for `domain`.
fn status_of(domain: &str, error: &EngineError) -> Status {
    match error {
        EngineError::UnknownAction(_) => {
            Status::invalid_argument(format!("domain: no policy limits the action '{domain}'"))
        }
        EngineError::Invalid(errors) => {
            Status::invalid_argument(message_of(errors).replace("requests[", "descriptors["))
        }
        EngineError::Overloaded | EngineError::BacklogFull { .. } | EngineError::Store(_) => {
            Status::unavailable(error.to_string())
        }
        EngineError::Ledger(_) => Status::unavailable(format!("the ledger failed: {error}")),
        EngineError::NotFound(_) | EngineError::Conflict(_) | EngineError::Broken(_) => {
            Status::internal(error.to_string())
        }
    }
}

/// The answer: `OVER_LIMIT` when the decisions (of one whole) deny, one status per
/// descriptor.
fn response_of(decisions: &[Decision]) -> RateLimitResponse {
    let allowed = decisions.iter().all(|d| d.allowed);
    RateLimitResponse {
        overall_code: code(allowed),
        statuses: decisions.iter().map(status_for).collect(),
        ..RateLimitResponse::default()
    }
}

fn code(allowed: bool) -> i32 {
    match allowed {
        true => Code::Ok as i32,
        false => Code::OverLimit as i32,
    }
}

/// One descriptor's status: over the limit when one of its enforced policies denied; the
/// limit shown is the one that denied, or else the one with the least remaining.
fn status_for(decision: &Decision) -> DescriptorStatus {
    let enforced = || decision.policies.iter().filter(|p| p.mode == Mode::Enforce);
    let denied = enforced().find(|p| !p.allowed);
    let shown = denied.or_else(|| enforced().min_by_key(|p| (p.remaining, p.window_seconds)));
    let Some(policy) = shown else {
        // No policy limits this descriptor.
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        };
    };
    // A lifetime never resets: no duration.
    let until_reset = policy
        .resets_at
        .map(|at| (at - decision.at).max(chrono::Duration::zero()));
    DescriptorStatus {
        code: code(denied.is_none()),
        current_limit: Some(RateLimit {
            name: policy.policy_id.to_string(),
            requests_per_unit: u32::try_from(policy.limit).unwrap_or(u32::MAX),
            unit: unit_of(policy) as i32,
        }),
        limit_remaining: u32::try_from(policy.remaining).unwrap_or(u32::MAX),
        duration_until_reset: until_reset.map(|until| {
            envoy_types::pb::google::protobuf::Duration {
                seconds: until.num_seconds(),
                nanos: until.subsec_nanos(),
            }
        }),
        ..DescriptorStatus::default()
    }
}

/// Envoy's unit for a policy's window: a calendar day in any zone (23 to 25 hours) is a day,
/// and a week, month or year that a daylight-saving change stretches or shrinks by up to an
/// hour is still a week, month or year; a window that is no unit is `UNKNOWN`.
fn unit_of(policy: &PolicyDecision) -> Unit {
    const DAY: u64 = 86_400;
    const HOUR: u64 = 3_600;
    match policy.window_seconds {
        1 => Unit::Second,
        60 => Unit::Minute,
        3_600 => Unit::Hour,
        82_800..=90_000 => Unit::Day,
        s if (7 * DAY - HOUR..=7 * DAY + HOUR).contains(&s) => Unit::Week,
        s if (28 * DAY - HOUR..=31 * DAY + HOUR).contains(&s) => Unit::Month,
        s if (365 * DAY - HOUR..=366 * DAY + HOUR).contains(&s) => Unit::Year,
        _ => Unit::Unknown,
    }
}

/// The rate limit service, served on a Tokio runtime of its own until dropped.
///
/// Not on the process's main runtime: under actix-web that one is a current-thread
/// runtime (each HTTP worker has its own), so every gRPC call would be decoded, decided and
/// encoded on one thread, which also drives the Redis connections and the drain; the
/// service then topped out at one core whatever the machine. Here tonic's connections and
/// calls run on as many threads as the machine has cores, and reach the stores through the
/// same engine (and connections) as the HTTP workers do.
pub(crate) struct GrpcServer {
    /// `None` once dropped.
    runtime: Option<tokio::runtime::Runtime>,
    /// The address it serves on.
    address: SocketAddr,
}

impl GrpcServer {
    /// Binds `address` (port 0 picks one) and serves the rate limit service and the gRPC
    /// health service there.
    pub(crate) fn start(address: SocketAddr, limiter: RateLimiter) -> anyhow::Result<Self> {
        use anyhow::Context;
        let listener = std::net::TcpListener::bind(address).context("binding")?;
        listener
            .set_nonblocking(true)
            .context("making the listener non-blocking")?;
        let bound = listener.local_addr().context("reading the bound address")?;
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("grpc")
            .enable_all()
            .build()
            .context("starting the gRPC runtime")?;
        runtime.spawn(async move {
            // Registered with this runtime's reactor: the listener must be made here.
            let served = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => serve(listener, limiter).await.map_err(anyhow::Error::from),
                Err(error) => Err(error.into()),
            };
            if let Err(error) = served {
                tracing::error!(error = %error, "the gRPC rate limit service stopped");
            }
        });
        Ok(Self {
            runtime: Some(runtime),
            address: bound,
        })
    }

    /// The address it serves on (the port picked, if 0 was asked for).
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        // Dropped from async code (the service's shutdown, tests): a runtime cannot block
        // there, so its tasks are dropped and its threads left to end by themselves.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The connections `listener` accepts, with TCP_NODELAY. tonic ignores its own
/// `tcp_nodelay` setting for a listener it did not bind: without it, Nagle's algorithm held
/// small answers until the client's delayed ACK, and 1-2% of calls took 40 ms (the bench's
/// gRPC p99 was 41 ms instead of 7).
fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Serves the rate limit service and the health service on `listener` until aborted.
async fn serve(
    listener: tokio::net::TcpListener,
    limiter: RateLimiter,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RateLimiter>>()
        .await;
    let service =
        RateLimitServiceServer::new(limiter).max_decoding_message_size(MAX_REQUEST_BYTES * 2);
    tonic::transport::Server::builder()
        .concurrency_limit_per_connection(MAX_IN_FLIGHT_PER_CONNECTION)
        .add_service(health)
        .add_service(service)
        .serve_with_incoming(incoming(listener))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::tokio_stream::StreamExt;

    #[tokio::test]
    async fn accepted_connections_send_small_answers_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding");
        let address = listener.local_addr().expect("an address");
        let mut incoming = incoming(listener);
        let _client = tokio::net::TcpStream::connect(address)
            .await
            .expect("connecting");
        let accepted = incoming
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(
            accepted.nodelay().expect("reading TCP_NODELAY"),
            "Nagle's algorithm would hold small answers for the client's delayed ACK"
        );
    }
}
