//! Errors as `application/problem+json` (RFC 9457): one enum, one status mapping.

use crate::domain::{FieldError, FieldErrors};
use crate::engine::ledger::LedgerError;
use crate::engine::{store::StoreError, EngineError};
use crate::logs::Throttle;
use crate::policy::PolicyStoreError;
use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of every error body.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer, per RFC 9457.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Problem {
    /// A stable URI naming the kind of problem, e.g. `urn:quota-ledger:problem:validation`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// A short summary of the kind of problem.
    pub(crate) title: String,
    /// The HTTP status code.
    pub(crate) status: u16,
    /// What went wrong this time.
    pub(crate) detail: String,
    /// The invalid fields (422 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) errors: Option<Vec<ProblemField>>,
}

/// One invalid field of a 422 answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ProblemField {
    /// The field's path, e.g. `window.timezone`.
    pub(crate) field: String,
    /// Why it is invalid.
    pub(crate) message: String,
}

/// Everything an API call can answer besides success.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: the body is not well-formed JSON (or a query is unusable).
    #[error("{0}")]
    Malformed(String),
    /// 401: missing or wrong bearer token; the sentence says which (never the token).
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403: a known API key that may not do this (another action, an operation it lacks,
    /// an admin change).
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such resource.
    #[error("{0}")]
    NotFound(String),
    /// 409: conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// 412: `If-Match` names a version that is no longer current.
    #[error("{0}")]
    PreconditionFailed(String),
    /// 413: body over the limit.
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 415: body is not JSON.
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// 422: well-formed but invalid fields.
    #[error("{0}")]
    Invalid(FieldErrors),
    /// 503: a store is down; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// 503: the ledger (SQL) could not commit the request's entry: nothing was changed.
    #[error("{0}")]
    LedgerUnavailable(String),
    /// 503: too many requests in flight; the excess is shed at once (never a reason to
    /// fail open, unlike a store outage).
    #[error("{0}")]
    Overloaded(String),
    /// 503: too many ledger entries wait in Redis for SQL (`QUOTA_LEDGER_BACKLOG_MAX`);
    /// nothing was charged. Never a reason to fail open.
    #[error("{0}")]
    BacklogFull(String),
    /// 500: a bug; the cause is logged, not shown.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    /// A 422 for one field.
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid(FieldError::new(field, message).into())
    }

    fn kind_and_title(&self) -> (&'static str, &'static str) {
        match self {
            Self::Malformed(_) => ("malformed-request", "Malformed request"),
            Self::Unauthorized(_) => ("unauthorized", "Unauthorized"),
            Self::Forbidden(_) => ("forbidden", "Forbidden"),
            Self::NotFound(_) => ("not-found", "Not found"),
            Self::Conflict(_) => ("conflict", "Conflict"),
            Self::PreconditionFailed(_) => ("precondition-failed", "Precondition failed"),
            Self::PayloadTooLarge(_) => ("payload-too-large", "Payload too large"),
            Self::UnsupportedMediaType => ("unsupported-media-type", "Unsupported media type"),
            Self::Invalid(_) => ("validation", "Invalid request"),
            Self::Unavailable(_) => ("store-unavailable", "Service unavailable"),
            Self::LedgerUnavailable(_) => ("ledger-unavailable", "Ledger unavailable"),
            Self::Overloaded(_) => ("overloaded", "Service overloaded"),
            Self::BacklogFull(_) => ("ledger-backlog-full", "Ledger backlog full"),
            Self::Internal(_) => ("internal", "Internal error"),
        }
    }
}

/// Builds a problem+json response for `status` with a `kind` slug.
pub(crate) fn problem_response(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: String,
) -> HttpResponse {
    HttpResponse::build(status)
        .content_type(PROBLEM_JSON)
        .json(Problem {
            kind: format!("urn:quota-ledger:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            errors: None,
        })
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_)
            | Self::LedgerUnavailable(_)
            | Self::Overloaded(_)
            | Self::BacklogFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(cause) = self {
            tracing::error!(
                error = format!("{cause:#}"),
                "request failed with an internal error"
            );
        }
        let status = self.status_code();
        let (kind, title) = self.kind_and_title();
        let errors = match self {
            Self::Invalid(fields) => Some(
                fields
                    .0
                    .iter()
                    .map(|e| ProblemField {
                        field: e.field.clone(),
                        message: e.message.clone(),
                    })
                    .collect(),
            ),
            _ => None,
        };
        let mut builder = HttpResponse::build(status);
        builder.content_type(PROBLEM_JSON);
        match self {
            Self::Unauthorized(_) => {
                builder.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            Self::Unavailable(_) | Self::LedgerUnavailable(_) | Self::Overloaded(_) => {
                builder.insert_header((header::RETRY_AFTER, "1"));
            }
            // The drain needs SQL back, then a few seconds.
            Self::BacklogFull(_) => {
                builder.insert_header((header::RETRY_AFTER, "5"));
            }
            _ => {}
        }
        builder.json(Problem {
            kind: format!("urn:quota-ledger:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: self.to_string(),
            errors,
        })
    }
}

impl From<FieldErrors> for ApiError {
    fn from(errors: FieldErrors) -> Self {
        Self::Invalid(errors)
    }
}

impl From<FieldError> for ApiError {
    fn from(error: FieldError) -> Self {
        Self::Invalid(error.into())
    }
}

impl From<PolicyStoreError> for ApiError {
    fn from(error: PolicyStoreError) -> Self {
        match error {
            PolicyStoreError::Conflict => Self::Conflict("it exists already".to_owned()),
            full @ PolicyStoreError::ActionFull { .. } => Self::Conflict(full.to_string()),
            outdated @ PolicyStoreError::Outdated { .. } => Self::Conflict(outdated.to_string()),
            PolicyStoreError::Unavailable(cause) => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %cause, count, "policy store unavailable");
                }
                Self::Unavailable("the policy store is unavailable; retry shortly".to_owned())
            }
            other => Self::Internal(other.into()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::UnknownAction(action) => {
                Self::NotFound(format!("no policy limits the action '{action}'"))
            }
            EngineError::Invalid(fields) => Self::Invalid(fields),
            EngineError::Store(
                StoreError::Unavailable(why)
                | StoreError::NotConnected(why)
                | StoreError::Timeout(why),
            ) => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %why, count, "counter store unavailable; failing closed");
                }
                Self::Unavailable("the counter store is unavailable; retry shortly".to_owned())
            }
            EngineError::Store(StoreError::Misconfigured(why)) => Self::Unavailable(why),
            EngineError::Store(StoreError::Unreplicated(why)) => {
                Self::Unavailable(format!("{why}; retry shortly"))
            }
            EngineError::Store(StoreError::Rebuilding { shard }) => Self::Unavailable(format!(
                "the counters of this subject (shard {shard}) are being rebuilt from the \
                 ledger, after Redis lost them or before their first use; nothing was \
                 charged; retry shortly"
            )),
            EngineError::Store(other) => Self::Internal(other.into()),
            EngineError::NotFound(what) => Self::NotFound(what),
            EngineError::Overloaded => Self::Overloaded(
                "a counter-store call timed out while the service was shedding load; retry shortly"
                    .to_owned(),
            ),
            EngineError::Conflict(what) => Self::Conflict(what),
            EngineError::BacklogFull { max } => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(
                        max,
                        count,
                        "ledger backlog full: consumes answered 503 until the drain catches up"
                    );
                }
                Self::BacklogFull(format!(
                    "{max} or more ledger entries wait in Redis to be written to SQL \
                     (QUOTA_LEDGER_BACKLOG_MAX); nothing was charged; retry once the ledger \
                     database is back and the backlog has drained"
                ))
            }
            EngineError::Ledger(error) => error.into(),
            EngineError::Broken(why) => Self::Internal(anyhow::anyhow!(why)),
        }
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        match error {
            LedgerError::BadCursor => Self::invalid(
                "cursor",
                "is not a next_cursor of this list; start again without one",
            ),
            LedgerError::Unavailable(cause) => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %cause, count, "ledger store unavailable");
                }
                Self::LedgerUnavailable(
                    "the ledger store is unavailable: nothing was changed; retry shortly"
                        .to_owned(),
                )
            }
            other => Self::Internal(other.into()),
        }
    }
}
