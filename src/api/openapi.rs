//! The OpenAPI 3.1 document, generated from the handlers' annotations.

use super::problem::{Problem, ProblemField};
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
        (name = "admin", description = "Policies and overrides (admin token)"),
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
            ("admin_token", "QUOTA_ADMIN_TOKEN, for /admin/*"),
            (
                "client_token",
                "one of QUOTA_CLIENT_TOKENS, for /quota/* (open when unset)",
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
            for variant in &mut window.items {
                if let RefOr::T(Schema::Object(object)) = variant {
                    object.additional_properties =
                        Some(Box::new(AdditionalProperties::FreeForm(false)));
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
    api
}

/// The document as pretty JSON with a trailing newline (the form committed in `openapi/`).
pub fn spec_json() -> String {
    let mut text = spec()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
