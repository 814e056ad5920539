//! The problem+json responses that several operations document in the same words, as named
//! sets for `#[utoipa::path(responses(...))]`: a handler lists its success and the sets it
//! answers (`responses((status = 200, ...), ClientAuthProblems, JsonBodyProblems)`), and
//! inline only the problems particular to it. A status a handler describes in words of its
//! own (`No such hold`, `Malformed JSON or If-Match`) stays inline there: a set holds only
//! what every handler listing it means alike. A handler lists each status once, in a set or
//! inline: of two entries for one status the later would silently replace the earlier.

use super::problem::{Problem, PROBLEM_JSON};
use std::collections::BTreeMap;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

/// A documented problem answer: its status and what it means.
type Answer = (u16, &'static str);

/// 400 from [`ApiJson`](super::extract::ApiJson): the body does not parse.
const MALFORMED_JSON: Answer = (400, "Malformed JSON");
/// 413 from `ApiJson`: past [`MAX_BODY_BYTES`](super::extract::MAX_BODY_BYTES).
const BODY_TOO_LARGE: Answer = (413, "Body over 64 KiB");
/// 415 from `ApiJson`: the content type is not JSON.
const NOT_JSON: Answer = (415, "Body not JSON");
/// 422 from `ApiJson` or the handler's own parsing, naming the fields.
const INVALID_FIELDS: Answer = (422, "Invalid fields");
/// 401 from [`Access`](super::extract::Access) on a call only a client token or a key may make.
const CLIENT_TOKEN: Answer = (
    401,
    "Missing or unknown client token or API key, or an expired or revoked key",
);
/// 403 from `Access`: a key without the operation, or outside its actions.
const KEY_FORBIDDEN: Answer = (
    403,
    "The API key may not use this operation, or act on this action (problem type forbidden)",
);
/// 401 from `Access` on a read the admin token may make too.
const READER_TOKEN: Answer = (
    401,
    "Missing or unknown token (a client token, an API key, or the admin token), or an expired or revoked key",
);
/// 401 from [`AdminAuth`](super::extract::AdminAuth) or [`AdminRead`](super::extract::AdminRead).
const ADMIN_TOKEN: Answer = (401, "Missing or wrong admin token (or API key, to read)");
/// 403 from `AdminAuth` or `AdminRead`: a key, on a change or without `admin:read`.
const ADMIN_FORBIDDEN: Answer = (
    403,
    "An API key: changes need the admin token, reads a key with admin:read (problem type forbidden)",
);
/// 503 of an admin call: the policy store does not answer.
const POLICY_STORE_DOWN: Answer = (503, "Policy store down");
/// 400 of a query whose parameters are closed: an unknown or a repeated one.
const BAD_QUERY: Answer = (400, "Unknown or repeated query parameter");
/// 404 of a charge: no policy names the request's action.
const UNKNOWN_ACTION: Answer = (404, "No policy limits the action");
/// 409 of a charge: its idempotency key was seen with another amount.
const KEY_REUSED: Answer = (409, "The idempotency key was used with another amount");
/// 503 of a charge: each cause has a problem type of its own.
const CHARGE_UNAVAILABLE: Answer = (
    503,
    "Counter store down (fail closed), overloaded, or the ledger backlog full (see the problem type)",
);

/// The responses for `answers`, each with a [`Problem`] body as `application/problem+json`:
/// what `(status = N, description = "…", body = Problem, content_type = "application/problem+json")`
/// documents.
fn problems(answers: &[Answer]) -> BTreeMap<String, RefOr<Response>> {
    answers
        .iter()
        .map(|&(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(Problem::name())))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
}

/// What a call with a JSON body (`ApiJson`) can be refused for, its syntax aside: 413, 415
/// and 422. For a handler whose 400 covers more than the body.
pub(crate) struct BodyProblems;

impl IntoResponses for BodyProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[BODY_TOO_LARGE, NOT_JSON, INVALID_FIELDS])
    }
}

/// Everything a JSON body (`ApiJson`) can be refused for: 400, 413, 415 and 422.
pub(crate) struct JsonBodyProblems;

impl IntoResponses for JsonBodyProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut responses = BodyProblems::responses();
        responses.extend(problems(&[MALFORMED_JSON]));
        responses
    }
}

/// The 401 and 403 of a `/quota/*` call that a client token or an API key may make.
pub(crate) struct ClientAuthProblems;

impl IntoResponses for ClientAuthProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[CLIENT_TOKEN, KEY_FORBIDDEN])
    }
}

/// The 401 and 403 of a read that a client token, an API key or the admin token may make.
pub(crate) struct ReaderAuthProblems;

impl IntoResponses for ReaderAuthProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[READER_TOKEN, KEY_FORBIDDEN])
    }
}

/// The 401 and 403 of an `/admin/*` call (`AdminAuth`, `AdminRead`).
pub(crate) struct AdminAuthProblems;

impl IntoResponses for AdminAuthProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[ADMIN_TOKEN, ADMIN_FORBIDDEN])
    }
}

/// What every policy or override call answers besides its own: 401 without the admin
/// token, 503 while the policy store is down.
pub(crate) struct PolicyAdminProblems;

impl IntoResponses for PolicyAdminProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut responses = AdminAuthProblems::responses();
        responses.extend(problems(&[POLICY_STORE_DOWN]));
        responses
    }
}

/// The 400 of a read whose query parameters are closed (the ledger, activity, verify).
pub(crate) struct QueryProblems;

impl IntoResponses for QueryProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[BAD_QUERY])
    }
}

/// Every problem a charge (a consume, or a hold) answers: the client token's, the JSON
/// body's, an unknown action (404), an idempotency key reused with another amount (409)
/// and 503 when the charge cannot be decided or recorded.
pub(crate) struct ChargeProblems;

impl IntoResponses for ChargeProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut responses = ClientAuthProblems::responses();
        responses.extend(JsonBodyProblems::responses());
        responses.extend(problems(&[UNKNOWN_ACTION, KEY_REUSED, CHARGE_UNAVAILABLE]));
        responses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_made_of_others_keeps_every_status_of_each() {
        let cases = [
            (JsonBodyProblems::responses().len(), 1 + 3),
            (PolicyAdminProblems::responses().len(), 2 + 1),
            (ChargeProblems::responses().len(), 2 + 4 + 3),
        ];
        for (statuses, parts) in cases {
            assert_eq!(statuses, parts);
        }
    }
}
