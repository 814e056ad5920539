//! Reading requests so that every failure is a problem+json answer: JSON bodies, who is
//! calling (asked of the [`Gate`]), and the `If-Match` precondition.

use super::problem::{problem_response, ApiError};
use super::AppState;
use crate::access::{Denial, Failure, Gate, Grant, Operation};
use crate::domain::{Action, ActionSet};
use crate::metrics::Metrics;
use actix_web::dev::{Payload, ServiceResponse};
use actix_web::http::header::{self, EntityTag, IfMatch};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

/// The largest request body accepted, in bytes (64 KiB).
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON body: 415 unless the content type is JSON, 413 past [`MAX_BODY_BYTES`],
/// 400 when malformed, 422 (naming the field) when a field has the wrong type or is missing.
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub(crate) T);

pub(super) fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let essence = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            essence == "application/json"
                || (essence.starts_with("application/") && essence.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// The field an error is about: serde reports a missing field at its parent's path.
fn field_of(path: &str, message: &str) -> String {
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name);
    match (path, missing) {
        (".", Some(name)) => name.to_owned(),
        (".", None) => "(body)".to_owned(),
        (parent, Some(name)) => format!("{parent}.{name}"),
        (parent, None) => parent.to_owned(),
    }
}

fn is_well_formed(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

/// Parses `bytes` as `T`, telling malformed JSON (400) from invalid fields (422).
///
/// A well-formed body is parsed once, directly; only a failing one is parsed again with its
/// path tracked, to name the field in the answer (tracking costs on every field).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match inner.classify() {
            // A type error may come before a syntax error later in the text: only a
            // well-formed document gets a 422 (checked on this error path alone).
            serde_json::error::Category::Data if is_well_formed(bytes) => {
                ApiError::invalid(field_of(&path, &inner.to_string()), inner.to_string())
            }
            _ => ApiError::Malformed(format!("the body is not valid JSON: {inner}")),
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::Malformed(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

impl<T: DeserializeOwned + 'static> FromRequest for ApiJson<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        if !is_json(req) {
            return Box::pin(async { Err(ApiError::UnsupportedMediaType) });
        }
        let body = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            let bytes = body.await.map_err(|error| {
                match error.as_response_error().status_code().as_u16() {
                    413 => ApiError::PayloadTooLarge(MAX_BODY_BYTES),
                    _ => ApiError::Malformed(format!("could not read the body: {error}")),
                }
            })?;
            parse_json(&bytes).map(ApiJson)
        })
    }
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn gate(req: &HttpRequest) -> Result<&Gate, ApiError> {
    req.app_data::<web::Data<Gate>>()
        .map(|gate| gate.get_ref())
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the gate is not configured")))
}

/// The answer to a refusal of the gate, counted in `/metrics`.
fn refusal(req: &HttpRequest, denial: Denial) -> ApiError {
    if let Some(state) = req.app_data::<web::Data<AppState>>() {
        state.metrics.auth_refused(denial.reason());
    }
    match denial {
        Denial::Unauthenticated(failure) => ApiError::Unauthorized(match failure {
            Failure::Missing => {
                "a bearer token is required: Authorization: Bearer <token or API key>"
            }
            Failure::Unknown => {
                "the bearer token is not a valid token or API key for this endpoint"
            }
            Failure::Expired => "the API key has expired",
            Failure::Revoked => "the API key has been revoked",
        }),
        Denial::Forbidden(why) => ApiError::Forbidden(why),
    }
}

/// Asks the [`Gate`] whether the request may use `op` (`None`: change `/admin/*`).
fn admit(req: &HttpRequest, op: Option<Operation>) -> Result<ActionSet, ApiError> {
    let gate = gate(req)?;
    let token = bearer(req);
    let answer = match op {
        Some(op) => gate.admit(token, op),
        None => gate.admit_admin_write(token).map(|()| ActionSet::All),
    };
    answer.map_err(|denial| refusal(req, denial))
}

/// Proof that the request carries the admin token: what every change under `/admin/*`
/// needs. An API key, even an `admin:read` one, is refused with 403.
#[derive(Debug)]
pub(crate) struct AdminAuth;

impl FromRequest for AdminAuth {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(admit(req, None).map(|_| AdminAuth))
    }
}

/// Proof that the request may read `/admin/*`: the admin token (`None`), or an API key
/// with the `admin:read` operation (`Some`: its grant).
#[derive(Debug)]
pub(crate) struct AdminRead(pub(crate) Option<Arc<Grant>>);

impl FromRequest for AdminRead {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(
            gate(req)
                .and_then(|gate| gate.reader(bearer(req)).map_err(|d| refusal(req, d)))
                .map(AdminRead),
        )
    }
}

/// The operation an endpoint of `/quota/*` is, as a type: what [`Access`] checks.
pub(crate) trait Needs {
    /// The operation.
    const OP: Operation;
}

/// The operations of `/quota/*`, as types for [`Access`].
pub(crate) mod op {
    use super::{Needs, Operation};

    macro_rules! operation {
        ($(#[$meta:meta])* $name:ident) => {
            $(#[$meta])*
            #[derive(Debug)]
            pub(crate) struct $name;

            impl Needs for $name {
                const OP: Operation = Operation::$name;
            }
        };
    }

    operation!(
        /// `POST /quota/consume`.
        Consume
    );
    operation!(
        /// `POST /quota/check`.
        Check
    );
    operation!(
        /// `GET /quota/usage`.
        Usage
    );
    operation!(
        /// `POST /quota/refund`.
        Refund
    );
    operation!(
        /// `POST /quota/holds` and a hold's commit and release.
        Holds
    );
    operation!(
        /// `GET /quota/ledger`.
        Ledger
    );
}

/// Proof that the request may use the operation `N`, and the actions it may act on: every
/// action for a client token (or while the endpoints are open), the key's actions for an
/// API key. 401 for an unknown, expired or revoked token; 403 for a key without `N`.
#[derive(Debug)]
pub(crate) struct Access<N: Needs> {
    /// The actions the request may act on.
    pub(crate) actions: ActionSet,
    /// Where a refusal is counted.
    metrics: Option<Arc<Metrics>>,
    needs: PhantomData<N>,
}

impl<N: Needs> Access<N> {
    /// 403 unless the request may act on `action`, naming it (and counted in `/metrics`).
    pub(crate) fn require(&self, action: &Action) -> Result<(), ApiError> {
        if self.actions.contains(action) {
            return Ok(());
        }
        if let Some(metrics) = &self.metrics {
            metrics.auth_refused("forbidden");
        }
        Err(ApiError::Forbidden(format!(
            "this API key may not act on the action '{action}'"
        )))
    }
}

impl<N: Needs> FromRequest for Access<N> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(admit(req, Some(N::OP)).map(|actions| {
            Access {
                actions,
                metrics: req
                    .app_data::<web::Data<AppState>>()
                    .map(|state| state.metrics.clone()),
                needs: PhantomData,
            }
        }))
    }
}

/// Reads `If-Match` (RFC 9110, section 13.1.1) strictly: `None` when the request has none,
/// 400 when it is malformed, so that a request meant to be conditional never runs
/// unconditionally.
///
/// Not actix's `IfMatch::parse`: that one drops list members it cannot parse (`3`, `"3`) and
/// looks for `*` on the first line only, so a typo would make a write unconditional.
pub(super) fn if_match(req: &HttpRequest) -> Result<Option<IfMatch>, ApiError> {
    let mut lines = Vec::new();
    for value in req.headers().get_all(header::IF_MATCH) {
        lines.push(value.to_str().map_err(|_| malformed_if_match())?);
    }
    if lines.is_empty() {
        return Ok(None);
    }
    parse_if_match(&lines)
        .map(Some)
        .ok_or_else(malformed_if_match)
}

fn malformed_if_match() -> ApiError {
    ApiError::Malformed("If-Match must be * or a list of entity tags such as \"3\"".to_owned())
}

/// `"*" / 1#entity-tag`, the lines read as one list; `None` if malformed, which includes an
/// empty list member and `*` among entity tags.
fn parse_if_match(lines: &[&str]) -> Option<IfMatch> {
    const OWS: [char; 2] = [' ', '\t'];
    let members: Vec<&str> = lines
        .iter()
        .flat_map(|line| list_members(line))
        .map(|member| member.trim_matches(OWS))
        .collect();
    if members == ["*"] {
        return Some(IfMatch::Any);
    }
    members
        .iter()
        .map(|member| member.parse::<EntityTag>().ok())
        .collect::<Option<Vec<_>>>()
        .map(IfMatch::Items)
}

/// Splits a header line at the commas outside double quotes: an entity tag may hold a comma.
fn list_members(line: &str) -> Vec<&str> {
    let mut members = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (at, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                members.push(&line[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    members.push(&line[start..]);
    members
}

/// Rewrites any error answer that is not problem+json yet (unknown route 404, 405, …).
pub(crate) fn problem_for_bare_errors<B>(
    res: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    // Our own answers (problem+json, and the JSON body of a 429) carry a content type;
    // actix's bare ones (no route, wrong method) have none or plain text.
    let bare = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    if !bare {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let (kind, detail) = match status.as_u16() {
        404 => (
            "not-found",
            format!("no route matches {}", res.request().path()),
        ),
        405 => (
            "method-not-allowed",
            format!(
                "{} is not allowed on {}",
                res.request().method(),
                res.request().path()
            ),
        ),
        _ => ("http-error", status.to_string()),
    };
    let title = status.canonical_reason().unwrap_or("Error");
    let (req, _) = res.into_parts();
    let response = problem_response(status, kind, title, detail).map_into_right_body();
    Ok(ErrorHandlerResponse::Response(ServiceResponse::new(
        req, response,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_is_a_star_or_a_list_of_entity_tags_and_nothing_else() {
        // Each list as actix writes it back (`IfMatch`'s Display), `None` when malformed.
        let cases: [(&[&str], Option<&str>); 26] = [
            (&["*"], Some("*")),
            (&[" \t* "], Some("*")),
            (&["\"3\""], Some(r#""3""#)),
            (&["W/\"3\""], Some(r#"W/"3""#)),
            (&["\"\""], Some(r#""""#)),
            (&["\"9\" ,\t\"3\""], Some(r#""9", "3""#)),
            (&["\"a,b\", W/\"3\""], Some(r#""a,b", W/"3""#)),
            (&["\"1\"", "\"2\""], Some(r#""1", "2""#)),
            (&["3"], None),
            (&["\"3"], None),
            (&["3\""], None),
            (&["W/"], None),
            (&["W/3"], None),
            (&["w/\"3\""], None),
            (&[""], None),
            (&["\"1\" \"2\""], None),
            (&["\"1\","], None),
            (&[",\"1\""], None),
            (&["\"1\",,\"2\""], None),
            (&["\"1\", garbage"], None),
            (&["*, \"1\""], None),
            (&["*", "*"], None),
            (&["*", "\"1\""], None),
            (&["\"1\"", ""], None),
            (&["\"a\"b\""], None),
            (&["\"a b\""], None),
        ];
        for (lines, expected) in cases {
            let parsed = parse_if_match(lines).map(|m| m.to_string());
            assert_eq!(parsed.as_deref(), expected, "If-Match: {lines:?}");
        }
    }

    #[test]
    fn malformed_json_is_400_and_wrong_types_are_422_with_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[expect(dead_code, reason = "only parsed, to see which errors parsing gives")]
        struct Body {
            limit: i64,
        }
        assert!(matches!(
            parse_json::<Body>(b"{"),
            Err(ApiError::Malformed(_))
        ));
        match parse_json::<Body>(br#"{"limit":"x"}"#) {
            Err(ApiError::Invalid(errors)) => assert_eq!(errors.0[0].field, "limit"),
            other => panic!("expected 422, got {other:?}"),
        }
        assert!(matches!(
            parse_json::<Body>(br#"{"limit":1} x"#),
            Err(ApiError::Malformed(_))
        ));
    }
}
