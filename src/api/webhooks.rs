//! Webhook endpoints: created (the signing secret shown once), listed, changed, deleted,
//! their secret rotated, a test event sent, and their deliveries read.

use super::extract::{AdminAuth, AdminRead, ApiJson};
use super::problem::{ApiError, Problem};
use super::responses::{JsonBodyProblems, PolicyAdminProblems, QueryProblems, WebhookProblems};
use super::AppState;
use crate::domain::{ActionGlob, FieldError, FieldErrors, PolicyId, MAX_GLOBS};
use crate::webhooks::{self, target, Delivery, Webhook, EVENT_TYPES};
use actix_web::http::header;
use actix_web::{delete, get, post, put, web, HttpResponse};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// How long a rotated secret still signs.
const ROTATION_GRACE_HOURS: i64 = 24;

/// An endpoint's fields as created or replaced.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookInput {
    /// Unique id (`[A-Za-z0-9_.-]`, 1-64); required on `POST`, ignored on `PUT`.
    #[schema(example = "ops-alerts")]
    id: Option<String>,
    /// Where deliveries are `POST`ed: `http` or `https`, whose host resolves only to
    /// public addresses (unless `QUOTA_WEBHOOK_ALLOW_PRIVATE=true`).
    #[schema(example = "https://hooks.example.com/quota")]
    url: String,
    /// The event types it receives: `budget.threshold`, `budget.threshold.resolved`,
    /// `webhook.test`; default: all.
    #[schema(example = json!(["budget.threshold"]))]
    events: Option<Vec<String>>,
    /// The actions whose events it receives, as globs (`sms.*`), at most 32; default: all.
    #[schema(example = json!(["sms.*"]))]
    actions: Option<Vec<String>>,
    /// Whether it receives deliveries; default true. Enabling a disabled endpoint resumes
    /// its pending deliveries.
    enabled: Option<bool>,
}

/// An endpoint as listed: never its secret.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookOut {
    id: String,
    url: String,
    /// Event types received (`[]`: all).
    events: Vec<String>,
    /// Action globs received (`[]`: all).
    actions: Vec<String>,
    enabled: bool,
    /// Since when every attempt has failed; `null` while it succeeds.
    failing_since: Option<DateTime<Utc>>,
    /// When it was disabled after failing for a day; `null` if not.
    disabled_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<&Webhook> for WebhookOut {
    fn from(w: &Webhook) -> Self {
        Self {
            id: w.id.clone(),
            url: w.url.clone(),
            events: w.events.clone(),
            actions: w.actions.clone(),
            enabled: w.enabled,
            failing_since: w.failing_since,
            disabled_at: w.disabled_at,
            created_at: w.created_at,
            updated_at: w.updated_at,
        }
    }
}

/// A created endpoint, with its signing secret: shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookCreated {
    #[serde(flatten)]
    webhook: WebhookOut,
    /// The signing secret (`whsec_…`, Standard Webhooks): keep it, it is not shown again.
    secret: String,
}

/// A new signing secret after a rotation.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RotatedSecret {
    /// The new secret: shown this once.
    secret: String,
    /// Until when the previous secret signs too (each delivery carries both signatures).
    previous_valid_until: DateTime<Utc>,
}

/// The endpoints.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookList {
    items: Vec<WebhookOut>,
}

/// One delivery of one event.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryOut {
    /// The event's id, sent as `webhook-id` on every attempt.
    event_id: String,
    event_type: String,
    /// `pending` or `delivered`.
    state: String,
    attempts: i64,
    /// The last attempt's HTTP status, if it got an answer.
    last_status: Option<i64>,
    /// Why the last attempt failed.
    last_error: Option<String>,
    /// When a pending delivery is attempted next.
    next_attempt_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    delivered_at: Option<DateTime<Utc>>,
    /// The event as delivered.
    #[schema(value_type = Object)]
    event: serde_json::Value,
}

impl From<Delivery> for DeliveryOut {
    fn from(d: Delivery) -> Self {
        let pending = d.state == "pending";
        Self {
            event: serde_json::from_str(&d.payload).unwrap_or(serde_json::Value::Null),
            event_id: d.event_id,
            event_type: d.event_type,
            state: d.state,
            attempts: d.attempts,
            last_status: d.last_status,
            last_error: d.last_error,
            next_attempt_at: pending.then_some(d.next_attempt_at),
            created_at: d.created_at,
            delivered_at: d.delivered_at,
        }
    }
}

/// The newest deliveries of an endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryList {
    items: Vec<DeliveryOut>,
}

/// How many deliveries to list.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct DeliveriesQuery {
    /// 1 to 500, default 100.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    limit: Option<String>,
}

/// `limit` of a deliveries query: 1 to 500, default 100; 422 naming it otherwise.
fn deliveries_limit(text: Option<&str>) -> Result<i64, ApiError> {
    match text.map(str::parse::<i64>) {
        None => Ok(100),
        Some(Ok(limit)) if (1..=500).contains(&limit) => Ok(limit),
        Some(_) => Err(FieldErrors(vec![FieldError::new(
            "limit",
            "must be a whole number from 1 to 500",
        )])
        .into()),
    }
}

impl From<webhooks::StoreError> for ApiError {
    fn from(error: webhooks::StoreError) -> Self {
        ApiError::Unavailable(format!("the webhook tables are unavailable: {error}"))
    }
}

/// The fields of `input`, checked: 422 naming each bad one (the URL resolved, and refused
/// if it is not public).
async fn checked(
    state: &AppState,
    input: WebhookInput,
) -> Result<(String, Vec<String>, Vec<String>, bool), ApiError> {
    let mut errors = FieldErrors::default();
    match target::parse(&input.url) {
        Ok(url) => {
            if let Err(error) = target::resolve(&url, state.webhook_allow_private).await {
                errors.push(FieldError::new("url", error.to_string()));
            }
        }
        Err(error) => errors.push(FieldError::new("url", error.to_string())),
    }
    let events = input.events.unwrap_or_default();
    for (i, event) in events.iter().enumerate() {
        if !EVENT_TYPES.contains(&event.as_str()) {
            errors.push(FieldError::new(
                format!("events[{i}]"),
                format!("must be one of {}", EVENT_TYPES.join(", ")),
            ));
        }
    }
    let actions = input.actions.unwrap_or_default();
    if actions.len() > MAX_GLOBS {
        errors.push(FieldError::new(
            "actions",
            format!("at most {MAX_GLOBS} globs"),
        ));
    }
    for (i, glob) in actions.iter().enumerate() {
        errors.take(ActionGlob::parse(&format!("actions[{i}]"), glob));
    }
    match errors.0.is_empty() {
        true => Ok((input.url, events, actions, input.enabled.unwrap_or(true))),
        false => Err(errors.into()),
    }
}

/// Creates an endpoint. The answer holds its signing secret, this once.
#[utoipa::path(
    tag = "admin",
    request_body = WebhookInput,
    responses(
        (status = 201, description = "Created; the secret is in the answer, this once", body = WebhookCreated),
        PolicyAdminProblems, JsonBodyProblems,
        (status = 409, description = "An endpoint with this id exists", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []))
)]
#[post("/admin/webhooks")]
pub(crate) async fn create_webhook(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    ApiJson(input): ApiJson<WebhookInput>,
) -> Result<HttpResponse, ApiError> {
    let id = match input.id.as_deref().map(|id| PolicyId::parse("id", id)) {
        Some(Ok(id)) => id.to_string(),
        Some(Err(error)) => return Err(FieldErrors(vec![error]).into()),
        None => return Err(FieldErrors(vec![FieldError::new("id", "is required")]).into()),
    };
    let (url, events, actions, enabled) = checked(&state, input).await?;
    let now = state.engine.now();
    let webhook = Webhook {
        id,
        url,
        secret: webhooks::sign::new_secret(),
        previous_secret: None,
        previous_until: None,
        events,
        actions,
        enabled,
        failing_since: None,
        disabled_at: None,
        created_at: now,
        updated_at: now,
    };
    if let Err(error) = state.webhooks.insert(&webhook).await {
        return Err(match error.is_conflict() {
            true => ApiError::Conflict(format!("a webhook '{}' exists already", webhook.id)),
            false => error.into(),
        });
    }
    tracing::info!(target: "audit", by = "admin token", webhook_id = webhook.id, url = webhook.url, "webhook created");
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/admin/webhooks/{}", webhook.id)))
        .json(WebhookCreated {
            webhook: WebhookOut::from(&webhook),
            secret: webhook.secret.clone(),
        }))
}

/// Lists the endpoints (never a secret).
#[utoipa::path(
    tag = "admin",
    responses((status = 200, description = "The endpoints", body = WebhookList), PolicyAdminProblems),
    security(("admin_token" = []))
)]
#[get("/admin/webhooks")]
pub(crate) async fn list_webhooks(
    _auth: AdminRead,
    state: web::Data<AppState>,
) -> Result<web::Json<WebhookList>, ApiError> {
    let items = state.webhooks.list().await?;
    Ok(web::Json(WebhookList {
        items: items.iter().map(WebhookOut::from).collect(),
    }))
}

/// The 404 of a call on an endpoint that does not exist.
fn no_webhook(id: &str) -> ApiError {
    ApiError::NotFound(format!("no webhook '{id}'"))
}

async fn found(state: &AppState, id: &str) -> Result<Webhook, ApiError> {
    state.webhooks.get(id).await?.ok_or_else(|| no_webhook(id))
}

/// One endpoint.
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 200, description = "The endpoint", body = WebhookOut), WebhookProblems),
    security(("admin_token" = []))
)]
#[get("/admin/webhooks/{id}")]
pub(crate) async fn get_webhook(
    _auth: AdminRead,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<web::Json<WebhookOut>, ApiError> {
    Ok(web::Json(WebhookOut::from(&found(&state, &id).await?)))
}

/// Replaces an endpoint's URL, filters and switch (its secret stays).
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id")),
    request_body = WebhookInput,
    responses((status = 200, description = "Changed", body = WebhookOut), WebhookProblems, JsonBodyProblems),
    security(("admin_token" = []))
)]
#[put("/admin/webhooks/{id}")]
pub(crate) async fn put_webhook(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    id: web::Path<String>,
    ApiJson(input): ApiJson<WebhookInput>,
) -> Result<web::Json<WebhookOut>, ApiError> {
    let mut webhook = found(&state, &id).await?;
    let (url, events, actions, enabled) = checked(&state, input).await?;
    if enabled && !webhook.enabled {
        // Enabled again: its pending deliveries resume, and the day of failures restarts.
        webhook.failing_since = None;
        webhook.disabled_at = None;
    }
    webhook.url = url;
    webhook.events = events;
    webhook.actions = actions;
    webhook.enabled = enabled;
    webhook.updated_at = state.engine.now();
    if !state.webhooks.update(&webhook).await? {
        return Err(no_webhook(&id));
    }
    Ok(web::Json(WebhookOut::from(&webhook)))
}

/// Deletes an endpoint and its deliveries.
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 204, description = "Deleted"), WebhookProblems),
    security(("admin_token" = []))
)]
#[delete("/admin/webhooks/{id}")]
pub(crate) async fn delete_webhook(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match state.webhooks.delete(&id).await? {
        true => Ok(HttpResponse::NoContent().finish()),
        false => Err(no_webhook(&id)),
    }
}

/// Rotates the signing secret: the answer holds the new one, this once; the previous one
/// signs too for 24 hours (each delivery then carries both signatures).
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 200, description = "Rotated", body = RotatedSecret), WebhookProblems),
    security(("admin_token" = []))
)]
#[post("/admin/webhooks/{id}/rotate-secret")]
pub(crate) async fn rotate_secret(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<web::Json<RotatedSecret>, ApiError> {
    let mut webhook = found(&state, &id).await?;
    let now = state.engine.now();
    let until = now + Duration::hours(ROTATION_GRACE_HOURS);
    let secret = webhooks::sign::new_secret();
    webhook.previous_secret = Some(std::mem::replace(&mut webhook.secret, secret.clone()));
    webhook.previous_until = Some(until);
    webhook.updated_at = now;
    state.webhooks.update(&webhook).await?;
    tracing::info!(target: "audit", by = "admin token", webhook_id = webhook.id, "webhook secret rotated");
    Ok(web::Json(RotatedSecret {
        secret,
        previous_valid_until: until,
    }))
}

/// The id of a test event.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TestSent {
    /// The event's id (its `webhook-id`); its delivery shows in the endpoint's deliveries.
    event_id: String,
}

/// Sends the endpoint a `webhook.test` event, delivered like any other.
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 202, description = "Queued for delivery", body = TestSent), WebhookProblems),
    security(("admin_token" = []))
)]
#[post("/admin/webhooks/{id}/test")]
pub(crate) async fn test_webhook(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let webhook = found(&state, &id).await?;
    let now = state.engine.now();
    let event_id = format!("test.{}", uuid::Uuid::now_v7());
    let payload = serde_json::json!({
        "type": webhooks::TEST_EVENT, "id": event_id, "at": now, "webhook_id": webhook.id,
    });
    state
        .webhooks
        .enqueue(
            &webhook.id,
            &event_id,
            webhooks::TEST_EVENT,
            &payload.to_string(),
            now,
        )
        .await?;
    Ok(HttpResponse::Accepted().json(TestSent { event_id }))
}

/// The endpoint's newest deliveries: event, state, attempts, last error, next attempt.
#[utoipa::path(
    tag = "admin",
    params(("id" = String, Path, description = "The endpoint's id"), DeliveriesQuery),
    responses((status = 200, description = "Its deliveries, newest first", body = DeliveryList), WebhookProblems, QueryProblems,
        (status = 422, description = "A limit outside 1 to 500", body = Problem, content_type = "application/problem+json")),
    security(("admin_token" = []))
)]
#[get("/admin/webhooks/{id}/deliveries")]
pub(crate) async fn list_deliveries(
    _auth: AdminRead,
    state: web::Data<AppState>,
    id: web::Path<String>,
    query: web::Query<DeliveriesQuery>,
) -> Result<web::Json<DeliveryList>, ApiError> {
    let limit = deliveries_limit(query.limit.as_deref())?;
    let webhook = found(&state, &id).await?;
    let items = state.webhooks.deliveries(&webhook.id, limit).await?;
    Ok(web::Json(DeliveryList {
        items: items.into_iter().map(DeliveryOut::from).collect(),
    }))
}
