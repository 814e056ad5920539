//! Reading requests so that every failure is a problem+json answer: JSON bodies, auth,
//! and the `If-Match` precondition.

use super::problem::{problem_response, ApiError};
use crate::config::Secret;
use actix_web::dev::{Payload, ServiceResponse};
use actix_web::http::header::{self, EntityTag, IfMatch};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::pin::Pin;
use subtle::{Choice, ConstantTimeEq};

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

/// The bearer tokens the service accepts.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    /// The admin token (`/admin/*`).
    pub(crate) admin: Secret,
    /// Client tokens (`/quota/*`); empty leaves those endpoints open.
    pub(crate) clients: Vec<Secret>,
}

/// Whether `given` equals `secret`, in time that depends only on `given`'s length.
///
/// `subtle`'s slice comparison returns at once when the lengths differ, which would tell
/// a caller timing it whether it guessed the secret's length; so the lengths are compared
/// as numbers and `given` is compared byte by byte with `secret` repeated to its length.
fn token_matches(given: &[u8], secret: &[u8]) -> Choice {
    let same_length = given.len().ct_eq(&secret.len());
    given
        .iter()
        .zip(secret.iter().cycle())
        .fold(same_length, |equal, (g, s)| equal & g.ct_eq(s))
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn tokens(req: &HttpRequest) -> Result<&Tokens, ApiError> {
    req.app_data::<web::Data<Tokens>>()
        .map(|data| data.get_ref())
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("tokens are not configured")))
}

/// Proof that the request carries the admin token.
#[derive(Debug)]
pub(crate) struct AdminAuth;

impl FromRequest for AdminAuth {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(AdminAuth::of(req))
    }
}

impl AdminAuth {
    fn of(req: &HttpRequest) -> Result<Self, ApiError> {
        tokens(req).and_then(|tokens| match bearer(req) {
            Some(given)
                if bool::from(token_matches(
                    given.as_bytes(),
                    tokens.admin.expose().as_bytes(),
                )) =>
            {
                Ok(AdminAuth)
            }
            _ => Err(ApiError::Unauthorized),
        })
    }
}

/// Proof that the request may use `/quota/*` (always, when no client tokens are set).
#[derive(Debug)]
pub(crate) struct ClientAuth;

impl FromRequest for ClientAuth {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(ClientAuth::of(req))
    }
}

impl ClientAuth {
    fn of(req: &HttpRequest) -> Result<Self, ApiError> {
        tokens(req).and_then(|tokens| {
            if tokens.clients.is_empty() {
                return Ok(ClientAuth);
            }
            let given = bearer(req).ok_or(ApiError::Unauthorized)?;
            // Every token is compared, also after a match: the time says nothing of which.
            let known = tokens.clients.iter().fold(Choice::from(0), |found, t| {
                found | token_matches(given.as_bytes(), t.expose().as_bytes())
            });
            bool::from(known)
                .then_some(ClientAuth)
                .ok_or(ApiError::Unauthorized)
        })
    }
}

/// Proof that the request may read usage and the ledger (`GET /quota/usage`,
/// `GET /quota/ledger`): what [`ClientAuth`] accepts, or the admin token, which the
/// operator console signs in with. Reads only: consumes, refunds and holds stay
/// [`ClientAuth`]'s.
#[derive(Debug)]
pub(crate) struct ReaderAuth;

impl FromRequest for ReaderAuth {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let result = match AdminAuth::of(req) {
            Ok(AdminAuth) => Ok(ReaderAuth),
            Err(_) => ClientAuth::of(req).map(|ClientAuth| ReaderAuth),
        };
        std::future::ready(result)
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
    fn a_token_matches_only_the_whole_secret() {
        let cases: [(&[u8], &[u8], bool); 9] = [
            (b"secret", b"secret", true),
            (b"", b"", true),
            (b"secret", b"secreT", false),
            (b"secret", b"secret2", false),
            (b"secret2", b"secret", false),
            (b"secretsecret", b"secret", false),
            (b"sec", b"secret", false),
            (b"", b"x", false),
            (b"x", b"", false),
        ];
        for (given, secret, expected) in cases {
            assert_eq!(
                bool::from(token_matches(given, secret)),
                expected,
                "{given:?} against {secret:?}"
            );
        }
    }

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
