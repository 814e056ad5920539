//! The OpenAPI 3.1 document, generated from the handlers' annotations.

use super::problem::{Problem, ProblemField};
use serde_json::{json, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_actix_web::AppExt;

/// The document's fixed parts; paths and schemas come from [`super::routes`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "quota-ledger",
        description = "Daily business limits enforced atomically: may SUBJECT do ACTION now, for AMOUNT?"
    ),
    modifiers(&BearerSchemes),
    components(schemas(Problem, ProblemField)),
    tags(
        (name = "quota", description = "Consume, check and read usage"),
        (name = "admin", description = "Policies, overrides and API keys (admin token)"),
        (name = "health", description = "Liveness, readiness and metrics (open: firewall them)"),
    )
)]
pub(crate) struct ApiDoc;

/// Adds the two bearer-token security schemes.
struct BearerSchemes;

impl Modify for BearerSchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, what) in [
            (
                "admin_token",
                "QUOTA_ADMIN_TOKEN, for /admin/*; an API key with the admin:read operation may \
                 read (GET) too",
            ),
            (
                "client_token",
                "an API key (POST /admin/keys: confined to its actions and operations) or one \
                 of QUOTA_CLIENT_TOKENS (full access), for /quota/*: send it as \
                 `Authorization: Bearer` once the service has a client token or a key (the \
                 operations do not declare it, since they are open while it has neither)",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
    }
}

/// Marks each variant of `WindowDto` as closed (`additionalProperties: false`), as serde's
/// `deny_unknown_fields` makes it: utoipa carries that attribute into structs, not into the
/// variants of an internally tagged enum. Applied once the routes have added their schemas.
struct ClosedWindowVariants;

impl Modify for ClosedWindowVariants {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{AdditionalProperties, Schema};
        use utoipa::openapi::RefOr;
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        if let Some(RefOr::T(Schema::OneOf(window))) = components.schemas.get_mut("WindowDto") {
            // Titled, so that generators name the variants' types (`CalendarWindow`), not
            // `WindowDtoType0`.
            let titles = [
                "CalendarWindow",
                "RollingWindow",
                "TokenBucketWindow",
                "RequestWindow",
                "LifetimeWindow",
            ];
            for (variant, title) in window.items.iter_mut().zip(titles) {
                if let RefOr::T(Schema::Object(object)) = variant {
                    object.additional_properties =
                        Some(Box::new(AdditionalProperties::FreeForm(false)));
                    object.title = Some(title.to_owned());
                }
            }
        }
    }
}

/// The complete document, as served at `/api-docs/openapi.json`.
pub(crate) fn spec() -> utoipa::openapi::OpenApi {
    let (_, mut api) = actix_web::App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(super::routes)
        .split_for_parts();
    ClosedWindowVariants.modify(&mut api);
    // The typed document round-trips through JSON for the edits below; it cannot fail for
    // a document utoipa built, and if it ever did the document is served as built.
    let Ok(mut doc) = serde_json::to_value(&api) else {
        return api;
    };
    for_generators(&mut doc);
    serde_json::from_value(doc).unwrap_or(api)
}

/// The schemas of answers whose every property is always sent (null when it has no value),
/// so every property is `required`: generated types then read `str | None`, not a
/// three-way `str | None | Unset`.
const ALWAYS_COMPLETE: [&str; 12] = [
    "ConsumeAnswer",
    "HoldAnswer",
    "SettleAnswer",
    "UsageAnswer",
    "PolicyUsage",
    "PolicyOut",
    "PolicyList",
    "OverrideOut",
    "OverrideList",
    "LedgerEntryOut",
    "LedgerList",
    "PolicyAmountOut",
];

/// Shapes the document for client generators, which take it literally:
/// - a query parameter is a plain type: a query string cannot carry `null`;
/// - answers list every property they always send as `required`;
/// - `HoldAnswer` is one object (the consume answer's properties and the hold's), not an
///   `allOf` that some generators cannot merge;
/// - the commit body is optional (`required: false`), not a body that may be `null`;
/// - the headers the server sends are declared: `WWW-Authenticate` on every 401 and
///   `Retry-After` on every 503.
fn for_generators(doc: &mut Value) {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for operation in paths.values_mut().filter_map(Value::as_object_mut) {
            for operation in operation.values_mut() {
                for parameter in operation
                    .get_mut("parameters")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if let Some(schema) = parameter.get_mut("schema") {
                        without_null(schema);
                    }
                }
                let responses = operation
                    .get_mut("responses")
                    .and_then(Value::as_object_mut);
                for (status, response) in responses.into_iter().flatten() {
                    let header = match status.as_str() {
                        "401" => (
                            "WWW-Authenticate",
                            "`Bearer`: the scheme the token is expected in",
                        ),
                        "503" => ("Retry-After", "Seconds to wait before trying again"),
                        _ => continue,
                    };
                    response["headers"][header.0] = json!({
                        "description": header.1,
                        "schema": {"type": "string"},
                    });
                }
            }
        }
        if let Some(body) = paths
            .get_mut("/quota/holds/{id}/commit")
            .and_then(|p| p.get_mut("post"))
            .and_then(|op| op.get_mut("requestBody"))
        {
            body["required"] = json!(false);
            body["content"]["application/json"]["schema"] =
                json!({"$ref": "#/components/schemas/CommitInput"});
        }
    }
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if let (Some(consume), Some(hold)) = (
        schemas.get("ConsumeAnswer").cloned(),
        schemas.get_mut("HoldAnswer"),
    ) {
        let mut merged = consume;
        let own = hold.pointer("/allOf/1/properties").cloned();
        if let (Some(into), Some(Value::Object(own))) = (
            merged.get_mut("properties").and_then(Value::as_object_mut),
            own,
        ) {
            into.extend(own);
            merged["description"] = hold["description"].clone();
            *hold = merged;
        }
    }
    for name in ALWAYS_COMPLETE {
        if let Some(schema) = schemas.get_mut(name) {
            let properties: Vec<Value> = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().map(|k| json!(k)).collect())
                .unwrap_or_default();
            schema["required"] = Value::Array(properties);
        }
    }
}

/// `schema` without its `null` alternative: `["string", "null"]` becomes `"string"`, and
/// `oneOf: [X, {"type": "null"}]` becomes X.
fn without_null(schema: &mut Value) {
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if let [single] = kept.as_slice() {
            schema["type"] = single.clone();
        }
    }
    let alternatives = schema.get("oneOf").and_then(Value::as_array).map(|items| {
        items
            .iter()
            .filter(|s| s.get("type").is_none_or(|t| t != "null"))
            .cloned()
            .collect::<Vec<_>>()
    });
    if let Some([single]) = alternatives.as_deref() {
        *schema = single.clone();
    }
}

/// The document as pretty JSON with a trailing newline (the form committed in `openapi/`).
pub fn spec_json() -> String {
    let mut text = spec()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
