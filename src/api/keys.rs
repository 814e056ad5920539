//! API keys: created, listed and revoked by the admin; each confined to actions and
//! operations (see `crate::access`).

use super::extract::{AdminAuth, AdminRead, ApiJson};
use super::problem::{ApiError, Problem};
use super::responses::{AdminAuthProblems, JsonBodyProblems, PolicyAdminProblems};
use super::wire::{GlobText, OperationName};
use super::AppState;
use crate::access::{new_secret, KeyRecord, Operation, Operations};
use crate::domain::{ActionGlob, FieldError, FieldErrors, MAX_GLOBS};
use actix_web::http::header;
use actix_web::{delete, get, post, web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A new API key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewKeyInput {
    /// What the key is for (1-100 printable characters), e.g. the backend that uses it.
    #[schema(example = "sms backend", min_length = 1, max_length = 100)]
    name: String,
    /// The actions the key may act on, as globs: `*` matches within one dot-separated
    /// segment (`sms.*` matches `sms.send`, not `sms.send.eu`). 1 to 32 of them.
    #[schema(example = json!(["sms.*", "transfer"]), value_type = Vec<GlobText>, min_items = 1, max_items = 32)]
    actions: Vec<String>,
    /// What the key may do: a non-empty subset of `consume`, `check`, `usage`, `refund`,
    /// `holds`, `ledger`, `admin:read`. Default: all but `admin:read`.
    #[schema(example = json!(["consume", "check", "usage"]), value_type = Option<Vec<OperationName>>, min_items = 1)]
    operations: Option<Vec<String>>,
    /// When the key stops working (RFC 3339, in the future); default: never.
    expires_at: Option<DateTime<Utc>>,
}

/// An API key as listed: never its secret.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyOut {
    /// The key's id, to revoke it with.
    #[schema(example = "key_01935c2a7f3e7a4c9d1b2e3f4a5b6c7d")]
    id: String,
    /// What the key is for.
    name: String,
    /// The key's first 12 characters, to recognise it.
    #[schema(example = "qlk_T3dQ9xWm")]
    prefix: String,
    /// The action globs it may act on.
    actions: Vec<String>,
    /// The operations it may use.
    operations: Vec<String>,
    /// When it stops working; `null`: never.
    expires_at: Option<DateTime<Utc>>,
    /// When it was created.
    created_at: DateTime<Utc>,
    /// When it was revoked; `null` while it is not.
    revoked_at: Option<DateTime<Utc>>,
    /// When a request last used it, written down every few seconds; `null` if never.
    last_used_at: Option<DateTime<Utc>>,
    /// `active`, `expired` or `revoked`.
    #[schema(example = "active")]
    state: &'static str,
}

impl KeyOut {
    fn of(key: &KeyRecord, now: DateTime<Utc>) -> Self {
        let state = match (key.revoked_at, key.expires_at) {
            (Some(_), _) => "revoked",
            (None, Some(at)) if at <= now => "expired",
            _ => "active",
        };
        Self {
            id: key.id.clone(),
            name: key.name.clone(),
            prefix: key.prefix.clone(),
            actions: key.actions.iter().map(ToString::to_string).collect(),
            operations: key
                .operations
                .iter()
                .map(|op| op.as_str().to_owned())
                .collect(),
            expires_at: key.expires_at,
            created_at: key.created_at,
            revoked_at: key.revoked_at,
            last_used_at: key.last_used_at,
            state,
        }
    }
}

/// A key just created: the only answer that holds its secret.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CreatedKey {
    /// The key, shown this once: only its SHA-256 is stored. Send it as
    /// `Authorization: Bearer <key>` (gRPC: `authorization` metadata).
    #[schema(example = "qlk_T3dQ9xWmR2vL8pKc1nF5aZ0sYbHjU7eGtDq4wXiMoN6")]
    key: String,
    /// The key as listed.
    #[serde(flatten)]
    listed: KeyOut,
    /// True when this key closed the quota endpoints: they were open (no client token,
    /// no key) and from now on every `/quota/*` call needs a client token or a key.
    closed_quota_endpoints: bool,
}

/// The keys.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyList {
    /// Every key, revoked and expired ones too, oldest first.
    items: Vec<KeyOut>,
}

/// Parses a new key's fields, naming every invalid one.
fn parse(
    input: NewKeyInput,
    now: DateTime<Utc>,
) -> Result<(Vec<ActionGlob>, Operations), ApiError> {
    let mut errors = FieldErrors::default();
    let name = input.name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        errors.push(FieldError::new(
            "name",
            "must be 1 to 100 printable characters",
        ));
    }
    if input.actions.is_empty() || input.actions.len() > MAX_GLOBS {
        errors.push(FieldError::new(
            "actions",
            format!("must list 1 to {MAX_GLOBS} action globs"),
        ));
    }
    let actions: Vec<ActionGlob> = input
        .actions
        .iter()
        .enumerate()
        .filter_map(|(i, glob)| errors.take(ActionGlob::parse(&format!("actions[{i}]"), glob)))
        .collect();
    let operations = match &input.operations {
        None => Operations::default_for_keys(),
        Some(ops) if ops.is_empty() => {
            errors.push(FieldError::new(
                "operations",
                "must name at least one operation",
            ));
            Operations::default()
        }
        Some(ops) => ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| errors.take(Operation::parse(&format!("operations[{i}]"), op)))
            .collect(),
    };
    if input.expires_at.is_some_and(|at| at <= now) {
        errors.push(FieldError::new("expires_at", "must be in the future"));
    }
    match errors.0.is_empty() {
        true => Ok((actions, operations)),
        false => Err(errors.into()),
    }
}

/// Creates an API key confined to `actions` and `operations`. The answer holds the key
/// itself, this once; only its SHA-256 is stored. The first key closes the quota
/// endpoints if they were open (`closed_quota_endpoints`).
#[utoipa::path(
    tag = "admin",
    request_body = NewKeyInput,
    responses(
        (status = 201, description = "Created; the key is in the answer, this once", body = CreatedKey,
            headers(("Location" = String, description = "The key's URL"))),
        PolicyAdminProblems, JsonBodyProblems,
        (status = 409, description = "An instance of a version that does not enforce keys is running: upgrade every instance first", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[post("/admin/keys")]
pub(crate) async fn create_key(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    ApiJson(input): ApiJson<NewKeyInput>,
) -> Result<HttpResponse, ApiError> {
    let now = state.engine.now();
    let name = input.name.trim().to_owned();
    let expires_at = input.expires_at;
    let (actions, operations) = parse(input, now)?;
    let secret = new_secret();
    let record = KeyRecord {
        id: format!("key_{}", uuid::Uuid::now_v7().simple()),
        name,
        prefix: secret.prefix,
        secret_hash: secret.secret_hash,
        actions,
        operations,
        expires_at,
        created_at: now,
        revoked_at: None,
        last_used_at: None,
    };
    let was_open = state.gate.quota_open();
    state.policy_admin().create_key(&record).await?;
    let closed = was_open && !state.gate.quota_open();
    tracing::info!(
        target: "audit",
        by = "admin token",
        key_id = record.id,
        name = record.name,
        actions = ?record.actions.iter().map(ActionGlob::as_str).collect::<Vec<_>>(),
        operations = ?record.operations.iter().map(Operation::as_str).collect::<Vec<_>>(),
        expires_at = ?record.expires_at,
        "API key created"
    );
    if closed {
        tracing::warn!(key_id = record.id, "the first API key closed the quota endpoints: every /quota/* call now needs a client token or a key");
    }
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/admin/keys/{}", record.id)))
        .json(CreatedKey {
            key: secret.key,
            listed: KeyOut::of(&record, now),
            closed_quota_endpoints: closed,
        }))
}

/// Lists every key (never a secret), with when each was last used.
#[utoipa::path(
    tag = "admin",
    responses((status = 200, description = "The keys", body = KeyList), PolicyAdminProblems),
    security(("admin_token" = []))
)]
#[get("/admin/keys")]
pub(crate) async fn list_keys(
    _auth: AdminRead,
    state: web::Data<AppState>,
) -> Result<web::Json<KeyList>, ApiError> {
    let now = state.engine.now();
    let keys = state.policies.list_keys().await?;
    Ok(web::Json(KeyList {
        items: keys.iter().map(|key| KeyOut::of(key, now)).collect(),
    }))
}

/// Who the caller is, for the console: the admin token, or an `admin:read` key.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WhoAmI {
    /// `admin_token` or `api_key`.
    #[schema(example = "api_key")]
    kind: &'static str,
    /// The key's id (`null` for the admin token).
    key_id: Option<String>,
    /// The key's name (`null` for the admin token).
    name: Option<String>,
    /// What the caller may do: every operation for the admin token.
    operations: Vec<String>,
    /// Whether it may change anything under `/admin/*`: only the admin token may.
    may_change: bool,
}

/// Who the bearer token is: the console signs in with it, and shows a read-only console
/// to an `admin:read` key.
#[utoipa::path(
    tag = "admin",
    responses((status = 200, description = "The caller", body = WhoAmI), AdminAuthProblems),
    security(("admin_token" = []))
)]
#[get("/admin/whoami")]
pub(crate) async fn whoami(AdminRead(key): AdminRead) -> web::Json<WhoAmI> {
    // No key: the admin token, which may do everything.
    let operations = key.as_ref().map_or_else(
        || Operation::ALL.into_iter().collect(),
        |grant| grant.operations,
    );
    web::Json(WhoAmI {
        kind: match key {
            None => "admin_token",
            Some(_) => "api_key",
        },
        key_id: key.as_ref().map(|grant| grant.id.clone()),
        name: key.as_ref().map(|grant| grant.name.clone()),
        operations: operations.iter().map(|op| op.as_str().to_owned()).collect(),
        may_change: key.is_none(),
    })
}

/// Revokes a key: every instance refuses it (401) within a second. Revoking a revoked key
/// changes nothing and answers the same.
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The key's id")),
    responses(
        (status = 200, description = "Revoked", body = KeyOut),
        PolicyAdminProblems,
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[delete("/admin/keys/{id}")]
pub(crate) async fn revoke_key(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<web::Json<KeyOut>, ApiError> {
    let now = state.engine.now();
    let (key, revoked) = state
        .policy_admin()
        .revoke_key(&id, now)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no API key '{id}'")))?;
    if revoked {
        tracing::info!(target: "audit", by = "admin token", key_id = key.id, name = key.name, "API key revoked");
    }
    Ok(web::Json(KeyOut::of(&key, now)))
}
