//! The quota API: consume, check and usage.

use super::dto::{MeasureDto, ModeDto};
use super::extract::{op, Access, ApiJson};
use super::problem::{ApiError, Problem};
use super::responses::{ChargeProblems, ClientAuthProblems, JsonBodyProblems, ReaderAuthProblems};
use super::wire::{optional_whole_number, AttributesMap, IdempotencyKey, Slug, SubjectText};
use super::AppState;
use crate::domain::{Action, Attributes, Budget, FieldErrors, Measure, Mode, Quantity, Subject};
use crate::engine::{ConsumeRequest, Decision, PolicyDecision};
use crate::metrics::Endpoint;
use actix_web::http::{header, StatusCode};
use actix_web::{get, post, web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// A request to charge (or check) an amount.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsumeInput {
    /// The action, e.g. `transfer`.
    #[schema(value_type = Slug, example = "transfer")]
    pub(crate) action: String,
    /// Who acts: 1-256 bytes of printable UTF-8.
    #[schema(value_type = SubjectText, example = "user-42")]
    pub(crate) subject: String,
    /// Minor units to charge to `amount` policies; default 1, at least 1.
    #[serde(default, deserialize_with = "optional_whole_number")]
    #[schema(example = 50000, minimum = 1, maximum = 9007199254740991_i64)]
    pub(crate) amount: Option<i64>,
    /// Makes retries safe: 1-128 characters, scoped to action + subject. A retry with the
    /// same key returns the original answer (`replayed: true`) and charges nothing more; the
    /// same key with another amount is 409. Kept at least 24 h and at least as long as the
    /// longest window charged. Only charged answers are kept: a denied consume may be retried.
    #[schema(value_type = Option<IdempotencyKey>)]
    pub(crate) idempotency_key: Option<String>,
    /// What policies' `scope` and `match` read, e.g. `{"country": "NG"}`.
    #[schema(value_type = Option<AttributesMap>)]
    pub(crate) attributes: Option<BTreeMap<String, String>>,
}

/// One policy's part of an answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyUsage {
    /// The policy.
    pub(crate) policy_id: String,
    /// `count` or `amount`.
    pub(crate) measure: MeasureDto,
    /// `enforce` or `shadow`.
    pub(crate) mode: ModeDto,
    /// The limit that applied (an override's, if any).
    pub(crate) limit: u64,
    /// Usage after this decision.
    pub(crate) used: u64,
    /// `limit - used`, never below zero.
    pub(crate) remaining: u64,
    /// When usage would be back to zero with no further consumption (UTC); null for a
    /// `lifetime` window, which never resets.
    #[serde(serialize_with = "super::timestamp::serialize_optional")]
    pub(crate) resets_at: Option<DateTime<Utc>>,
    /// Whether this policy alone allows the request (shadow policies report, never deny).
    pub(crate) allowed: bool,
    /// The budget the request falls in: the values of the policy's scope, e.g.
    /// `{"subject": "user-42"}` (the default scope), `{"country": "NG"}`, `{}` (global).
    #[schema(example = json!({"subject": "user-42"}))]
    pub(crate) budget: BTreeMap<String, String>,
}

/// A budget as answers name it: its scope's keys and values.
pub(super) fn budget_out(budget: &Budget) -> BTreeMap<String, String> {
    budget
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The answer to a consume or check (the same shape for 200 and 429).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConsumeAnswer {
    /// Whether the request is allowed (and, for consume, charged).
    pub(crate) allowed: bool,
    /// The action.
    pub(crate) action: String,
    /// The subject.
    pub(crate) subject: String,
    /// The amount asked for.
    pub(crate) amount: u64,
    /// Identifies this consume (for refunds and the ledger); null for checks and denials.
    pub(crate) consumption_id: Option<String>,
    /// True when this answer replays an earlier one with the same idempotency key.
    pub(crate) replayed: bool,
    /// Seconds until the same request would pass; null if allowed or if it never can.
    pub(crate) retry_after_seconds: Option<u64>,
    /// True when the counter store was down and the service was configured to fail open.
    pub(crate) degraded: bool,
    /// One entry per enabled policy of the action.
    pub(crate) policies: Vec<PolicyUsage>,
}

/// Current usage of one subject for one action.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UsageAnswer {
    /// The action.
    pub(crate) action: String,
    /// The subject.
    pub(crate) subject: String,
    /// One entry per enabled policy.
    pub(crate) policies: Vec<PolicyUsage>,
}

/// Which usage to read. Both are required; a missing one is named in the 422. Attributes
/// come as `attributes[<key>]=<value>` (declared beside these).
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct UsageQuery {
    /// The action.
    #[param(required = true, value_type = Slug, example = "transfer")]
    pub(crate) action: Option<String>,
    /// The subject.
    #[param(required = true, value_type = SubjectText, example = "user-42")]
    pub(crate) subject: Option<String>,
    /// Every other parameter: `attributes[<key>]` ones, any other is refused.
    #[serde(flatten)]
    #[param(ignore)]
    pub(crate) rest: BTreeMap<String, String>,
}

/// The attributes of a usage query: its `attributes[<key>]=<value>` parameters (the
/// document's `deepObject`), or plain `<key>=<value>` ones, as client generators that
/// flatten an object parameter send them. Every name is checked as an attribute key.
fn usage_attributes(
    rest: &BTreeMap<String, String>,
    errors: &mut FieldErrors,
) -> Option<Attributes> {
    let map = rest.iter().map(|(name, value)| {
        let key = name
            .strip_prefix("attributes[")
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        (key.to_owned(), value.clone())
    });
    attributes(Some(map.collect()), errors)
}

pub(super) fn usage_of(p: &PolicyDecision) -> PolicyUsage {
    PolicyUsage {
        policy_id: p.policy_id.as_str().to_owned(),
        measure: match p.measure {
            Measure::Count => MeasureDto::Count,
            Measure::Amount => MeasureDto::Amount,
        },
        mode: match p.mode {
            Mode::Enforce => ModeDto::Enforce,
            Mode::Shadow => ModeDto::Shadow,
        },
        limit: p.limit,
        used: p.used,
        remaining: p.remaining,
        resets_at: p.resets_at,
        allowed: p.allowed,
        budget: budget_out(&p.budget),
    }
}

/// Parses an idempotency key: 1-128 printable characters.
pub(super) fn idempotency_key(
    value: Option<String>,
) -> Result<Option<crate::domain::IdempotencyKey>, crate::domain::FieldError> {
    value
        .map(|key| crate::domain::IdempotencyKey::parse(&key))
        .transpose()
        .map_err(|_| {
            crate::domain::FieldError::new(
                "idempotency_key",
                "must be 1 to 128 printable characters",
            )
        })
}

/// Parses a request's attributes, adding any error to `errors`.
pub(super) fn attributes(
    map: Option<BTreeMap<String, String>>,
    errors: &mut FieldErrors,
) -> Option<Attributes> {
    match Attributes::parse("attributes", map.unwrap_or_default()) {
        Ok(attributes) => Some(attributes),
        Err(more) => {
            errors.0.extend(more.0);
            None
        }
    }
}

/// Validates a consume (or hold) body into an engine request, collecting field errors.
pub(super) fn parse(
    action: &str,
    subject: &str,
    amount: Option<i64>,
    key: Option<String>,
    attributes: Option<BTreeMap<String, String>>,
    errors: &mut FieldErrors,
) -> Option<ConsumeRequest> {
    let action = errors.take(Action::parse("action", action));
    let subject = errors.take(Subject::parse("subject", subject));
    let amount = errors.take(Quantity::parse_amount(
        "amount",
        i128::from(amount.unwrap_or(1)),
    ));
    let idempotency_key = errors.take(idempotency_key(key));
    let attributes = self::attributes(attributes, errors);
    match (action, subject, amount, idempotency_key, attributes) {
        (Some(action), Some(subject), Some(amount), Some(idempotency_key), Some(attributes))
            if errors.0.is_empty() =>
        {
            Some(ConsumeRequest {
                action,
                subject,
                amount,
                idempotency_key,
                attributes,
                anonymous: false,
            })
        }
        _ => None,
    }
}

fn parse_consume(input: &ConsumeInput) -> Result<ConsumeRequest, ApiError> {
    let mut errors = FieldErrors::default();
    parse(
        &input.action,
        &input.subject,
        input.amount,
        input.idempotency_key.clone(),
        input.attributes.clone(),
        &mut errors,
    )
    .ok_or_else(|| errors.into())
}

/// Parses a consume or check body, counting a rejected one (400, 413, 415, 422) as `invalid`.
fn parse_counted(
    state: &AppState,
    endpoint: Endpoint,
    body: Result<ApiJson<ConsumeInput>, ApiError>,
) -> Result<ConsumeRequest, ApiError> {
    let metrics = &state.metrics;
    let input =
        body.inspect_err(|_| metrics.observe_invalid(endpoint, None, state.engine.policies()))?;
    parse_consume(&input.0).inspect_err(|_| {
        metrics.observe_invalid(endpoint, Some(&input.0.action), state.engine.policies());
    })
}

/// The policy whose limit binds hardest: a denying enforcing one, else the least remaining.
pub(super) fn most_constraining(decision: &Decision) -> Option<&PolicyDecision> {
    // A per-request maximum (no window: 0 seconds, and a reset time, unlike a lifetime) is
    // no quota that runs out: it names the headers only when it is what denies.
    decision.policies.iter().min_by_key(|p| {
        let denying = p.mode == Mode::Enforce && !p.allowed;
        let per_request = p.window_seconds == 0 && p.resets_at.is_some();
        (!denying, p.mode == Mode::Shadow, per_request, p.remaining)
    })
}

/// Names the decision on the request's span, when traces are exported.
pub(super) fn record_decision(allowed: bool) {
    if crate::telemetry::exporting() {
        let decision = if allowed { "allowed" } else { "denied" };
        tracing::Span::current().record("decision", decision);
    }
}

/// `"<policy>";<a>=<x>;<b>=<y>`: one IETF RateLimit field value, written without `format!`;
/// without `;<b>=<y>` when `second` is `None` (a lifetime: no window, no reset).
fn rate_limit_field(policy: &str, (a, x): (&str, u64), second: Option<(&str, u64)>) -> String {
    let mut numbers = (itoa::Buffer::new(), itoa::Buffer::new());
    let x = numbers.0.format(x);
    let mut field = String::with_capacity(policy.len() + 2 * x.len() + 12);
    for part in ["\"", policy, "\";", a, "=", x] {
        field.push_str(part);
    }
    if let Some((b, y)) = second {
        for part in [";", b, "=", numbers.1.format(y)] {
            field.push_str(part);
        }
    }
    field
}

/// Writes the answer with its status and the `RateLimit-Policy` / `RateLimit` fields
/// (IETF httpapi draft: `"<policy>";q=<limit>;w=<seconds>` and `"<policy>";r=<remaining>;t=<seconds>`).
pub(super) fn respond(
    request: &ConsumeRequest,
    decision: Decision,
    consumption_id: Option<String>,
    replayed: bool,
) -> (actix_web::HttpResponseBuilder, ConsumeAnswer) {
    const RATELIMIT_POLICY: header::HeaderName =
        header::HeaderName::from_static("ratelimit-policy");
    const RATELIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit");
    let status = match decision.allowed {
        true => StatusCode::OK,
        false => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut response = HttpResponse::build(status);
    if let Some(p) = most_constraining(&decision) {
        // A lifetime has neither a window nor a reset: `w` and `t` are left out.
        let reset = p
            .resets_at
            .map(|at| ("t", (at - decision.at).num_seconds().max(0).unsigned_abs()));
        let window = reset.map(|_| ("w", p.window_seconds));
        let id = p.policy_id.as_str();
        response.insert_header((
            RATELIMIT_POLICY,
            rate_limit_field(id, ("q", p.limit), window),
        ));
        response.insert_header((RATELIMIT, rate_limit_field(id, ("r", p.remaining), reset)));
    }
    if let Some(seconds) = decision.retry_after_seconds {
        response.insert_header((header::RETRY_AFTER, seconds.to_string()));
    }
    let answer = ConsumeAnswer {
        allowed: decision.allowed,
        action: request.action.as_str().to_owned(),
        subject: request.subject.as_str().to_owned(),
        amount: request.amount.get(),
        consumption_id,
        replayed,
        retry_after_seconds: decision.retry_after_seconds,
        degraded: decision.degraded,
        policies: decision.policies.iter().map(usage_of).collect(),
    };
    (response, answer)
}

/// Charges `amount` (count policies: 1) to every enabled policy of the action, atomically:
/// all pass and all are charged, or none is. Denied: 429 with the same body and `Retry-After`.
#[utoipa::path(
    tag = "quota",
    request_body = ConsumeInput,
    responses(
        (status = 200, description = "Allowed and charged", body = ConsumeAnswer,
            headers(("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        (status = 429, description = "Denied; nothing charged", body = ConsumeAnswer,
            headers(("Retry-After" = String, description = "Seconds until the same request would pass; absent if it never can"),
                ("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        ChargeProblems,
    ),
)]
#[post("/quota/consume")]
pub(crate) async fn consume(
    access: Access<op::Consume>,
    state: web::Data<AppState>,
    body: Result<ApiJson<ConsumeInput>, ApiError>,
) -> Result<HttpResponse, ApiError> {
    let request = parse_counted(&state, Endpoint::Consume, body)?;
    access.require(&request.action)?;
    let consumed = super::metrics::consume(&state, &request, None).await?;
    record_decision(consumed.decision.allowed);
    // A denial charged nothing, so there is nothing to refund: no id.
    let consumption_id = consumed
        .consumption_id
        .filter(|_| consumed.decision.allowed)
        .map(|id| id.to_string());
    let (response, answer) = respond(
        &request,
        consumed.decision,
        consumption_id,
        consumed.replayed,
    );
    Ok(json_body(response, &answer))
}

/// `response` with `answer` as its JSON body, written into a buffer sized for a typical
/// answer at once (`HttpResponseBuilder::json` starts small and grows it several times).
fn json_body(mut response: actix_web::HttpResponseBuilder, answer: &ConsumeAnswer) -> HttpResponse {
    let mut body = Vec::with_capacity(256 + 256 * answer.policies.len());
    match serde_json::to_writer(&mut body, answer) {
        Ok(()) => response
            .insert_header(header::ContentType::json())
            .body(body),
        Err(error) => {
            HttpResponse::from_error(actix_web::error::JsonPayloadError::Serialize(error))
        }
    }
}

/// Answers exactly as consume would, but charges nothing.
#[utoipa::path(
    tag = "quota",
    request_body = ConsumeInput,
    responses(
        (status = 200, description = "Would be allowed", body = ConsumeAnswer,
            headers(("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        (status = 429, description = "Would be denied", body = ConsumeAnswer,
            headers(("Retry-After" = String, description = "Seconds until it would pass; absent if it never can"),
                ("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        ClientAuthProblems, JsonBodyProblems,
        (status = 404, description = "No policy limits the action", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Counter store down (fail closed)", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[post("/quota/check")]
pub(crate) async fn check(
    access: Access<op::Check>,
    state: web::Data<AppState>,
    body: Result<ApiJson<ConsumeInput>, ApiError>,
) -> Result<HttpResponse, ApiError> {
    let request = parse_counted(&state, Endpoint::Check, body)?;
    access.require(&request.action)?;
    let decision = super::metrics::check(&state, &request).await?;
    record_decision(decision.allowed);
    let (response, answer) = respond(&request, decision, None, false);
    Ok(json_body(response, &answer))
}

/// Current usage per enabled policy of the action, for one subject.
#[utoipa::path(
    tag = "quota",
    params(
        UsageQuery,
        ("attributes" = Option<AttributesMap>, Query, style = DeepObject, explode,
            description = "The request's attributes, as `attributes[country]=NG` (plain `country=NG` is accepted too): what the policies' `scope` and `match` read"),
    ),
    responses(
        (status = 200, description = "Usage", body = UsageAnswer),
        ReaderAuthProblems,
        (status = 400, description = "Unusable query string (e.g. a repeated parameter)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No policy limits the action", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing or invalid action or subject", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Counter store down", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[get("/quota/usage")]
pub(crate) async fn usage(
    access: Access<op::Usage>,
    state: web::Data<AppState>,
    query: web::Query<UsageQuery>,
) -> Result<web::Json<UsageAnswer>, ApiError> {
    let mut errors = FieldErrors::default();
    let action = errors.take(Action::parse(
        "action",
        query.action.as_deref().unwrap_or(""),
    ));
    let subject = errors.take(Subject::parse(
        "subject",
        query.subject.as_deref().unwrap_or(""),
    ));
    let attributes = usage_attributes(&query.rest, &mut errors);
    let (Some(action), Some(subject), Some(attributes), true) =
        (action, subject, attributes, errors.0.is_empty())
    else {
        return Err(errors.into());
    };
    access.require(&action)?;
    let outcome = state
        .engine
        .decider()
        .usage(&action, &subject, &attributes)
        .await;
    state.metrics.observe_store(outcome.as_ref());
    let decision = outcome?;
    Ok(web::Json(UsageAnswer {
        action: action.to_string(),
        subject: subject.to_string(),
        policies: decision.policies.iter().map(usage_of).collect(),
    }))
}
