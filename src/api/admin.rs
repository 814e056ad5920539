//! The admin API: policy and override CRUD, behind the admin token.

use super::dto::{
    NewPolicyInput, OverrideInput, OverrideList, OverrideOut, PolicyInput, PolicyList, PolicyOut,
};
use super::extract::{if_match, AdminAuth, AdminRead, ApiJson};
use super::problem::{ApiError, Problem};
use super::responses::{BodyProblems, JsonBodyProblems, PolicyAdminProblems, PolicyProblems};
use super::wire::{Slug, SubjectText};
use super::AppState;
use crate::domain::{
    Budget, CalendarPeriod, Override, Policy, PolicyId, PolicySpec, Subject, Window,
};
use crate::policy::PolicyStoreError;
use actix_web::http::header::{self, ETag, EntityTag, IfMatch};
use actix_web::{delete, get, post, put, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

/// Filters of the policy list.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct PolicyFilter {
    /// Only policies of this action.
    pub(crate) action: Option<String>,
}

/// A policy's `ETag`: its version as a strong entity tag, such as `"3"`.
fn etag(version: i64) -> ETag {
    ETag(EntityTag::new_strong(version.to_string()))
}

/// 412 unless `If-Match` is absent, `*`, or names the current version as a strong tag (weak
/// tags never match: RFC 9110 compares entity tags strongly for `If-Match`); 400 if it is
/// malformed.
fn check_version(req: &HttpRequest, current: &Policy) -> Result<(), ApiError> {
    let current_tag = EntityTag::new_strong(current.version.to_string());
    match if_match(req)? {
        Some(IfMatch::Items(tags)) if !tags.iter().any(|tag| tag.strong_eq(&current_tag)) => {
            Err(ApiError::PreconditionFailed(format!(
                "policy '{}' is at version {}, which If-Match does not name",
                current.id, current.version
            )))
        }
        _ => Ok(()),
    }
}

/// The 412 of a write that lost a race: the policy's version moved on since it was read.
fn changed_concurrently(id: &PolicyId) -> ApiError {
    ApiError::PreconditionFailed(format!("policy '{id}' changed concurrently; read it again"))
}

/// The answer to a policy write the store refused; any other store error as usual.
fn refused(error: PolicyStoreError, id: &PolicyId) -> ApiError {
    match error {
        PolicyStoreError::Conflict => {
            ApiError::Conflict(format!("a policy with id '{id}' exists already"))
        }
        other => other.into(),
    }
}

/// 422 when `spec`'s window is longer than the ledger keeps entries: a restart or a Redis
/// loss rebuilds usage from the ledger, and could not rebuild what retention deleted. A
/// lifetime needs the whole ledger.
fn kept_long_enough(state: &AppState, spec: &PolicySpec) -> Result<(), ApiError> {
    const YEAR_DAYS: u32 = 367;
    let Some(days) = state.ledger_retention_days else {
        return Ok(()); // kept for ever
    };
    let (field, why) = match spec.window {
        Window::Calendar {
            period: CalendarPeriod::Year,
            ..
        } if days < YEAR_DAYS => (
            "window.period",
            format!("a year period needs the ledger kept at least {YEAR_DAYS} days"),
        ),
        Window::Lifetime => (
            "window.type",
            "a lifetime window needs the ledger kept for ever \
             (QUOTA_LEDGER_RETENTION_DAYS=forever)"
                .to_owned(),
        ),
        _ => return Ok(()),
    };
    Err(ApiError::invalid(
        field,
        format!(
            "{why}, to rebuild its usage after a restart or a Redis loss; \
             QUOTA_LEDGER_RETENTION_DAYS is {days}"
        ),
    ))
}

/// The 404 of a call on a policy that does not exist (`raw`: the id as the path gives it).
fn no_policy(raw: &str) -> ApiError {
    ApiError::NotFound(format!("no policy '{raw}'"))
}

fn policy_id(raw: &str) -> Result<PolicyId, ApiError> {
    PolicyId::parse("id", raw).map_err(|_| no_policy(raw))
}

async fn existing(state: &AppState, raw: &str) -> Result<Policy, ApiError> {
    let id = policy_id(raw)?;
    state
        .policies
        .get_policy(&id)
        .await?
        .ok_or_else(|| no_policy(raw))
}

/// Lists policies, optionally of one action.
#[utoipa::path(
    tag = "admin",
    params(PolicyFilter),
    responses(
        (status = 200, description = "The policies", body = PolicyList),
        PolicyAdminProblems,
        (status = 400, description = "Unusable query string (e.g. a repeated parameter)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[get("/admin/policies")]
pub(crate) async fn list_policies(
    _auth: AdminRead,
    state: web::Data<AppState>,
    filter: web::Query<PolicyFilter>,
) -> Result<web::Json<PolicyList>, ApiError> {
    let policies = state.policies.list_policies().await?;
    let items = policies
        .iter()
        .filter(|p| {
            filter
                .action
                .as_deref()
                .is_none_or(|a| p.spec.action.as_str() == a)
        })
        .map(PolicyOut::from)
        .collect();
    Ok(web::Json(PolicyList {
        items,
        next_cursor: None,
    }))
}

/// Creates a policy.
#[utoipa::path(
    tag = "admin",
    request_body = NewPolicyInput,
    responses(
        (status = 201, description = "Created", body = PolicyOut,
            headers(("Location" = String, description = "The policy's URL"), ("ETag" = String, description = "The version"))),
        PolicyAdminProblems, JsonBodyProblems,
        (status = 409, description = "The id is taken, the action has 32 policies already, or the window has anchors or a year period while an instance of a version that cannot read them is live", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[post("/admin/policies")]
pub(crate) async fn create_policy(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    ApiJson(NewPolicyInput(body)): ApiJson<NewPolicyInput>,
) -> Result<HttpResponse, ApiError> {
    let (id, spec) = body.parse()?;
    let id = id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
    kept_long_enough(&state, &spec)?;
    let now = state.engine.now();
    let policy = Policy {
        id,
        spec,
        created_at: now,
        updated_at: now,
        version: 1,
    };
    state
        .policy_admin()
        .create(&policy)
        .await
        .map_err(|e| refused(e, &policy.id))?;
    tracing::info!(target: "audit", by = "admin token", policy_id = %policy.id, action = %policy.spec.action, "policy created");
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/admin/policies/{}", policy.id)))
        .insert_header(etag(policy.version))
        .json(PolicyOut::from(&policy)))
}

/// Reads one policy; its `ETag` is the version.
#[utoipa::path(
    tag = "admin",
    params(("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily"))),
    responses(
        (status = 200, description = "The policy", body = PolicyOut, headers(("ETag" = String, description = "The version"))),
        PolicyProblems,
    ),
    security(("admin_token" = []))
)]
#[get("/admin/policies/{id}")]
pub(crate) async fn get_policy(
    _auth: AdminRead,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let policy = existing(&state, &id).await?;
    Ok(HttpResponse::Ok()
        .insert_header(etag(policy.version))
        .json(PolicyOut::from(&policy)))
}

/// Replaces a policy. `If-Match` (the `ETag`) makes it fail with 412 if someone changed it.
///
/// Changing only the limit, mode, description or switches keeps current usage; a new
/// window or measure starts counting afresh.
#[utoipa::path(
    tag = "admin",
    params(
        ("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily")),
        ("If-Match" = Option<String>, Header, nullable = false, description = "The ETag read before: `*` or entity tags such as `\"3\"`; a weak tag never matches",
            pattern = r#"^[ \t]*(\*|(W/)?"[\x21\x23-\x7E]*"([ \t]*,[ \t]*(W/)?"[\x21\x23-\x7E]*")*)[ \t]*$"#),
    ),
    request_body = PolicyInput,
    responses(
        (status = 200, description = "Replaced", body = PolicyOut, headers(("ETag" = String, description = "The new version"))),
        PolicyProblems, BodyProblems,
        (status = 400, description = "Malformed JSON or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The action has 32 policies already, or the window has anchors or a year period while an instance of a version that cannot read them is live", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "Stale If-Match", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[put("/admin/policies/{id}")]
pub(crate) async fn replace_policy(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    body: ApiJson<PolicyInput>,
) -> Result<HttpResponse, ApiError> {
    let current = existing(&state, &id).await?;
    let (body_id, spec) = body.0.parse()?;
    if body_id.is_some_and(|b| b != current.id) {
        return Err(ApiError::invalid("id", "must match the id in the path"));
    }
    kept_long_enough(&state, &spec)?;
    check_version(&req, &current)?;
    if spec.scope != current.spec.scope
        && !state
            .policies
            .list_overrides(Some(&current.id))
            .await?
            .is_empty()
    {
        return Err(ApiError::Conflict(format!(
            "policy '{}' has overrides naming budgets of its scope: delete them before \
             changing the scope",
            current.id
        )));
    }
    let policy = Policy {
        spec,
        updated_at: state.engine.now(),
        version: current.version + 1,
        ..current.clone()
    };
    if !state
        .policy_admin()
        .replace(&policy, current.version)
        .await
        .map_err(|e| refused(e, &policy.id))?
    {
        return Err(changed_concurrently(&policy.id));
    }
    tracing::info!(target: "audit", by = "admin token", policy_id = %policy.id, version = policy.version,
        usage_kept = current.spec.keeps_usage_of(&policy.spec), "policy replaced");
    Ok(HttpResponse::Ok()
        .insert_header(etag(policy.version))
        .json(PolicyOut::from(&policy)))
}

/// Deletes a policy and its overrides.
#[utoipa::path(
    tag = "admin",
    params(
        ("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily")),
        ("If-Match" = Option<String>, Header, nullable = false, description = "The ETag read before: `*` or entity tags such as `\"3\"`; a weak tag never matches",
            pattern = r#"^[ \t]*(\*|(W/)?"[\x21\x23-\x7E]*"([ \t]*,[ \t]*(W/)?"[\x21\x23-\x7E]*")*)[ \t]*$"#),
    ),
    responses(
        (status = 204, description = "Deleted"),
        PolicyProblems,
        (status = 400, description = "Malformed If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "Stale If-Match", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[delete("/admin/policies/{id}")]
pub(crate) async fn delete_policy(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let current = existing(&state, &id).await?;
    check_version(&req, &current)?;
    if !state
        .policy_admin()
        .delete(&current.id, current.version)
        .await?
    {
        return Err(changed_concurrently(&current.id));
    }
    tracing::info!(target: "audit", by = "admin token", policy_id = %current.id, "policy deleted");
    Ok(HttpResponse::NoContent().finish())
}

/// Lists the overrides of a policy.
#[utoipa::path(
    tag = "admin",
    params(("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily"))),
    responses(
        (status = 200, description = "The overrides", body = OverrideList),
        PolicyProblems,
    ),
    security(("admin_token" = []))
)]
#[get("/admin/policies/{id}/overrides")]
pub(crate) async fn list_overrides(
    _auth: AdminRead,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<web::Json<OverrideList>, ApiError> {
    let policy = existing(&state, &id).await?;
    let items = state.policies.list_overrides(Some(&policy.id)).await?;
    Ok(web::Json(OverrideList {
        items: items.iter().map(OverrideOut::from).collect(),
        next_cursor: None,
    }))
}

async fn override_target(
    state: &AppState,
    id: &str,
    subject: &str,
) -> Result<(Policy, Subject), ApiError> {
    let policy = existing(state, id).await?;
    // The segment names one budget of the policy's scope (the subject, by default).
    Budget::from_text("subject", &policy.spec.scope, subject)?;
    let subject = Subject::parse("subject", subject)?;
    Ok((policy, subject))
}

/// Reads one override.
#[utoipa::path(
    tag = "admin",
    params(("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily")), ("subject" = SubjectText, Path, description = "Subject (URL-encoded)", example = json!("user-42"))),
    responses(
        (status = 200, description = "The override", body = OverrideOut),
        PolicyAdminProblems,
        (status = 404, description = "No such policy or override", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid subject", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[get("/admin/policies/{id}/overrides/{subject}")]
pub(crate) async fn get_override(
    _auth: AdminRead,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<web::Json<OverrideOut>, ApiError> {
    let (policy, subject) = override_target(&state, &path.0, &path.1).await?;
    let item = state
        .policies
        .get_override(&policy.id, &subject)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!("no override of '{}' for this subject", policy.id))
        })?;
    Ok(web::Json(OverrideOut::from(&item)))
}

/// Creates or replaces the override of a policy for one subject.
#[utoipa::path(
    tag = "admin",
    params(("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily")), ("subject" = SubjectText, Path, description = "Subject (URL-encoded)", example = json!("user-42"))),
    request_body = OverrideInput,
    responses(
        (status = 200, description = "Replaced", body = OverrideOut),
        (status = 201, description = "Created", body = OverrideOut),
        PolicyProblems, JsonBodyProblems,
    ),
    security(("admin_token" = []))
)]
#[put("/admin/policies/{id}/overrides/{subject}")]
pub(crate) async fn put_override(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: ApiJson<OverrideInput>,
) -> Result<HttpResponse, ApiError> {
    let (policy, subject) = override_target(&state, &path.0, &path.1).await?;
    let spec = body.0.parse(&policy.spec.window)?;
    let now = state.engine.now();
    let previous = state.policies.get_override(&policy.id, &subject).await?;
    let item = Override {
        policy_id: policy.id.clone(),
        subject,
        spec,
        created_at: previous.as_ref().map_or(now, |p| p.created_at),
        updated_at: now,
    };
    state.policy_admin().save_override(&item).await?;
    tracing::info!(target: "audit", by = "admin token", policy_id = %item.policy_id, limit = item.spec.limit.get(), "override saved");
    let mut response = match previous {
        Some(_) => HttpResponse::Ok(),
        None => HttpResponse::Created(),
    };
    Ok(response.json(OverrideOut::from(&item)))
}

/// Deletes the override of a policy for one subject.
#[utoipa::path(
    tag = "admin",
    params(("id" = Slug, Path, description = "Policy id", example = json!("transfer-usd-daily")), ("subject" = SubjectText, Path, description = "Subject (URL-encoded)", example = json!("user-42"))),
    responses(
        (status = 204, description = "Deleted"),
        PolicyAdminProblems,
        (status = 404, description = "No such policy or override", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid subject", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[delete("/admin/policies/{id}/overrides/{subject}")]
pub(crate) async fn delete_override(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (policy, subject) = override_target(&state, &path.0, &path.1).await?;
    if !state
        .policy_admin()
        .delete_override(&policy.id, &subject)
        .await?
    {
        return Err(ApiError::NotFound(format!(
            "no override of '{}' for this subject",
            policy.id
        )));
    }
    Ok(HttpResponse::NoContent().finish())
}
