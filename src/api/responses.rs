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
/// 404 of a call on one policy: there is none of that id.
const NO_POLICY: Answer = (404, "No such policy");
/// 404 of a call on one webhook endpoint: there is none of that id.
const NO_ENDPOINT: Answer = (404, "No such endpoint");
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

/// Declares a named set of problem responses: the union of the sets named before `+`s and
/// the answers in brackets, a later entry for a status replacing an earlier one.
macro_rules! problem_set {
    ($(#[$doc:meta])* $name:ident: $($set:ident +)* [$($answer:expr),* $(,)?]) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                let mut responses = BTreeMap::new();
                $(responses.extend($set::responses());)*
                responses.extend(problems(&[$($answer),*]));
                responses
            }
        }
    };
}

problem_set! {
    /// What a call with a JSON body (`ApiJson`) can be refused for, its syntax aside: 413,
    /// 415 and 422. For a handler whose 400 covers more than the body.
    BodyProblems: [BODY_TOO_LARGE, NOT_JSON, INVALID_FIELDS]
}

problem_set! {
    /// Everything a JSON body (`ApiJson`) can be refused for: 400, 413, 415 and 422.
    JsonBodyProblems: BodyProblems + [MALFORMED_JSON]
}

problem_set! {
    /// The 401 and 403 of a `/quota/*` call that a client token or an API key may make.
    ClientAuthProblems: [CLIENT_TOKEN, KEY_FORBIDDEN]
}

problem_set! {
    /// The 401 and 403 of a read that a client token, an API key or the admin token may make.
    ReaderAuthProblems: [READER_TOKEN, KEY_FORBIDDEN]
}

problem_set! {
    /// The 401 and 403 of an `/admin/*` call (`AdminAuth`, `AdminRead`).
    AdminAuthProblems: [ADMIN_TOKEN, ADMIN_FORBIDDEN]
}

problem_set! {
    /// What every policy or override call answers besides its own: 401 without the admin
    /// token, 503 while the policy store is down.
    PolicyAdminProblems: AdminAuthProblems + [POLICY_STORE_DOWN]
}

problem_set! {
    /// What every call on one policy answers besides its own: the admin calls' problems,
    /// and 404 when there is no such policy.
    PolicyProblems: PolicyAdminProblems + [NO_POLICY]
}

problem_set! {
    /// What every call on one webhook endpoint answers besides its own: the admin calls'
    /// problems, and 404 when there is no such endpoint.
    WebhookProblems: PolicyAdminProblems + [NO_ENDPOINT]
}

problem_set! {
    /// The 400 of a read whose query parameters are closed (the ledger, activity, verify).
    QueryProblems: [BAD_QUERY]
}

problem_set! {
    /// Every problem a charge (a consume, or a hold) answers: the client token's, the JSON
    /// body's, an unknown action (404), an idempotency key reused with another amount (409)
    /// and 503 when the charge cannot be decided or recorded.
    ChargeProblems: ClientAuthProblems + JsonBodyProblems
        + [UNKNOWN_ACTION, KEY_REUSED, CHARGE_UNAVAILABLE]
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
