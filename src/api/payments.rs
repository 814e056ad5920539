//! Payment-grade operations: refunds of consumes, and holds (reserve now, settle later).

use super::extract::{op, parse_json, Access, ApiJson};
use super::ledger::LedgerEntryOut;
use super::problem::{ApiError, Problem};
use super::quota::{idempotency_key, parse, respond, usage_of, ConsumeAnswer, PolicyUsage};
use super::responses::{ChargeProblems, ClientAuthProblems, JsonBodyProblems};
use super::wire::{
    optional_whole_number, whole_number, AttributesMap, IdempotencyKey, Slug, SubjectText,
};
use super::AppState;
use crate::domain::{ConsumptionId, FieldErrors, HoldId, Quantity};
use crate::engine::decision::giveback::Settle;
use crate::engine::Settled;
use crate::policy::Gate;
use actix_web::{post, web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The longest a hold may last: 30 days.
pub(crate) const MAX_HOLD_SECONDS: i64 = 30 * 24 * 3_600;

/// A refund of all or part of an allowed consume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundInput {
    /// The `consumption_id` of the consume.
    #[schema(min_length = 1, max_length = 64)]
    pub(crate) consumption_id: String,
    /// Minor units to give back; default: everything not refunded yet.
    #[serde(default, deserialize_with = "optional_whole_number")]
    #[schema(minimum = 1, maximum = 9007199254740991_i64)]
    pub(crate) amount: Option<i64>,
    /// Makes retries safe (scoped to the consumption).
    #[schema(value_type = Option<IdempotencyKey>)]
    pub(crate) idempotency_key: Option<String>,
}

/// A request to reserve quota now and settle later.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HoldInput {
    /// The action.
    #[schema(value_type = Slug, example = "transfer")]
    pub(crate) action: String,
    /// The subject.
    #[schema(value_type = SubjectText, example = "user-42")]
    pub(crate) subject: String,
    /// Minor units to hold; default 1.
    #[serde(default, deserialize_with = "optional_whole_number")]
    #[schema(minimum = 1, maximum = 9007199254740991_i64)]
    pub(crate) amount: Option<i64>,
    /// Seconds until the hold is released unless settled; 1 to 2,592,000 (30 days).
    #[serde(deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 2592000)]
    pub(crate) ttl_seconds: i64,
    /// Makes retries safe (scoped to action + subject).
    #[schema(value_type = Option<IdempotencyKey>)]
    pub(crate) idempotency_key: Option<String>,
    /// What policies' `scope` and `match` read, e.g. `{"country": "NG"}`.
    #[schema(value_type = Option<AttributesMap>)]
    pub(crate) attributes: Option<std::collections::BTreeMap<String, String>>,
}

/// The answer to a hold: the consume answer plus the hold.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HoldAnswer {
    /// The decision, as for a consume.
    #[serde(flatten)]
    pub(crate) decision: ConsumeAnswer,
    /// The hold's id (null when denied).
    pub(crate) hold_id: Option<String>,
    /// When it is released unless settled (null when denied).
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

/// Settles at most the held amount, or more with `over_capture`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommitInput {
    /// Minor units to keep (1 ..= held, or more with `over_capture`); default: all of it.
    /// The rest is given back.
    #[serde(default, deserialize_with = "optional_whole_number")]
    #[schema(minimum = 1, maximum = 9007199254740991_i64)]
    pub(crate) amount: Option<i64>,
    /// Keep more than was held (the real cost is known only now: the tokens an LLM call
    /// used, a tip): the excess is charged to every amount policy the hold charged, past
    /// its limit if need be, and recorded in the commit entry; later consumes are denied
    /// until usage falls back below the limit. Without it, `amount` above the hold is 409.
    #[serde(default)]
    pub(crate) over_capture: bool,
}

/// The ledger entry written, and current usage.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SettleAnswer {
    /// The ledger entry written (or, for a replayed refund, written before).
    pub(crate) entry: LedgerEntryOut,
    /// Current usage per policy of the action, after it.
    pub(crate) policies: Vec<PolicyUsage>,
    /// True when this replays an earlier refund with the same idempotency key.
    pub(crate) replayed: bool,
}

fn answer(settled: Settled) -> HttpResponse {
    HttpResponse::Ok().json(SettleAnswer {
        entry: LedgerEntryOut::from(&settled.entry),
        policies: settled
            .usage
            .map(|u| u.policies.iter().map(usage_of).collect())
            .unwrap_or_default(),
        replayed: settled.replayed,
    })
}

fn optional_amount(errors: &mut FieldErrors, value: Option<i64>) -> Option<Quantity> {
    value.and_then(|v| errors.take(Quantity::parse_amount("amount", i128::from(v))))
}

/// Gives back all or part of an allowed consume, to exactly the periods and buckets it was
/// charged to (a period that has ended changes no current usage; the refund is still
/// recorded). Refunds never exceed the charge.
#[utoipa::path(
    tag = "quota",
    request_body = RefundInput,
    responses(
        (status = 200, description = "Refunded", body = SettleAnswer),
        ClientAuthProblems, JsonBodyProblems,
        (status = 404, description = "No such consumption (or one of an action the API key may not act on)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Over-refund, or an idempotency key reused with another amount", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "A store is down", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[post("/quota/refund")]
pub(crate) async fn refund(
    access: Access<op::Refund>,
    state: web::Data<AppState>,
    body: ApiJson<RefundInput>,
) -> Result<HttpResponse, ApiError> {
    let input = body.0;
    let mut errors = FieldErrors::default();
    let amount = optional_amount(&mut errors, input.amount);
    let key = errors.take(idempotency_key(input.idempotency_key));
    if input.consumption_id.is_empty() || input.consumption_id.chars().count() > 64 {
        errors.push(crate::domain::FieldError::new(
            "consumption_id",
            "must be a consumption_id",
        ));
    }
    let Some(key) = key.filter(|_| errors.0.is_empty()) else {
        return Err(errors.into());
    };
    let consumption_id = ConsumptionId::parse(&input.consumption_id)
        .map_err(|_| ApiError::NotFound(format!("no consumption '{}'", input.consumption_id)))?;
    let settled = state
        .engine
        .decider()
        .refund(consumption_id, amount, key, &access.actions)
        .await?;
    Ok(answer(settled))
}

/// Reserves quota now, charged like a consume (same 200/429 answer), plus a `hold_id` and
/// `expires_at`. Settle it with commit or release; unsettled holds are released at expiry.
#[utoipa::path(
    tag = "quota",
    request_body = HoldInput,
    responses(
        (status = 200, description = "Held", body = HoldAnswer,
            headers(("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        (status = 429, description = "Denied; nothing held", body = HoldAnswer,
            headers(("Retry-After" = String, description = "Seconds until the same request would pass; absent if it never can"),
                ("RateLimit-Policy" = String, description = "Most constraining policy"), ("RateLimit" = String, description = "Its remaining quota and reset"))),
        ChargeProblems,
    ),
)]
#[post("/quota/holds")]
pub(crate) async fn create_hold(
    access: Access<op::Holds>,
    state: web::Data<AppState>,
    body: ApiJson<HoldInput>,
) -> Result<HttpResponse, ApiError> {
    let input = body.0;
    let mut errors = FieldErrors::default();
    if !(1..=MAX_HOLD_SECONDS).contains(&input.ttl_seconds) {
        errors.push(crate::domain::FieldError::new(
            "ttl_seconds",
            format!("must be between 1 and {MAX_HOLD_SECONDS}"),
        ));
    }
    let request = parse(
        &input.action,
        &input.subject,
        input.amount,
        input.idempotency_key,
        input.attributes,
        &mut errors,
    )
    .ok_or_else(|| ApiError::from(errors))?;
    access.require(&request.action)?;
    let held =
        super::metrics::consume(&state, &request, Some(input.ttl_seconds.unsigned_abs())).await?;
    super::quota::record_decision(held.decision.allowed);
    let (mut response, decision) = respond(&request, held.decision, None, held.replayed);
    Ok(response.json(HoldAnswer {
        decision,
        hold_id: held.hold.as_ref().map(|h| h.hold_id.to_string()),
        expires_at: held.hold.map(|h| h.expires_at),
    }))
}

/// Settles a hold: keeps `amount` (default: all of it), gives back the rest.
#[utoipa::path(
    tag = "quota",
    params(("id" = String, Path, description = "The hold_id")),
    request_body(content = CommitInput, description = "Optional; an empty body commits everything"),
    responses(
        (status = 200, description = "Committed", body = SettleAnswer),
        ClientAuthProblems, JsonBodyProblems,
        (status = 404, description = "No such hold (or one of an action the API key may not act on)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already settled or expired, or more than held", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Counter store down", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[post("/quota/holds/{id}/commit")]
pub(crate) async fn commit_hold(
    access: Access<op::Holds>,
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let input: CommitInput = match body.is_empty() {
        true => CommitInput::default(),
        // `null` is the JSON spelling of "no body" (the schema's optional request body).
        false => {
            let ApiJson(input) = ApiJson::<Option<CommitInput>>::from_bytes(&req, &body)?;
            input.unwrap_or_default()
        }
    };
    let mut errors = FieldErrors::default();
    let amount = optional_amount(&mut errors, input.amount);
    if !errors.0.is_empty() {
        return Err(errors.into());
    }
    if input.over_capture {
        // 0.1.0 would take an over-captured commit for a give-back: not while it runs.
        let now = state.engine.now();
        state.policies.ensure_open(Gate::OverCapture, now).await?;
    }
    let settled = state
        .engine
        .decider()
        .settle(
            hold_id(&id)?,
            Settle::Commit {
                amount,
                over_capture: input.over_capture,
            },
            &access.actions,
        )
        .await?;
    Ok(answer(settled))
}

/// Gives a whole hold back.
#[utoipa::path(
    tag = "quota",
    params(("id" = String, Path, description = "The hold_id")),
    responses(
        (status = 200, description = "Released", body = SettleAnswer),
        ClientAuthProblems,
        (status = 404, description = "No such hold (or one of an action the API key may not act on)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already settled or expired", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Counter store down", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[post("/quota/holds/{id}/release")]
pub(crate) async fn release_hold(
    access: Access<op::Holds>,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let settled = state
        .engine
        .decider()
        .settle(hold_id(&id)?, Settle::Release, &access.actions)
        .await?;
    Ok(answer(settled))
}

impl<T: serde::de::DeserializeOwned> ApiJson<T> {
    /// Parses an already-read body with the same rules as the extractor (415, 400, 422).
    pub(crate) fn from_bytes(req: &HttpRequest, body: &[u8]) -> Result<Self, ApiError> {
        if !super::extract::is_json(req) {
            return Err(ApiError::UnsupportedMediaType);
        }
        parse_json(body).map(ApiJson)
    }
}

/// The hold a path names; one that cannot be a hold id is unknown (404), like a hold
/// that never existed.
fn hold_id(text: &str) -> Result<HoldId, ApiError> {
    HoldId::parse(text).map_err(|_| ApiError::NotFound(format!("no hold '{text}'")))
}
