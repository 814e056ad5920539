//! The answer for requests that no route takes: 405 with `Allow` when the path is a
//! documented one (the method is not), 404 otherwise; both problem+json.
//!
//! actix-web's route macros guard each resource by method, so a known path with another
//! method would fall through to a bare 404. The paths and their methods are read from the
//! OpenAPI document, which is generated from the same registrations as the routes.

use super::problem::problem_response;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use std::sync::OnceLock;

/// One documented path template, split into segments (`None` for a `{parameter}`), and the
/// value of its `Allow` header.
struct Route {
    segments: Vec<Option<String>>,
    allow: HeaderValue,
}

fn routes() -> &'static [Route] {
    static ROUTES: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let spec = super::openapi::spec();
        spec.paths
            .paths
            .iter()
            .map(|(path, item)| {
                let segments = path
                    .split('/')
                    .map(|s| (!(s.starts_with('{') && s.ends_with('}'))).then(|| s.to_owned()))
                    .collect();
                let methods = [
                    ("GET", item.get.is_some()),
                    ("PUT", item.put.is_some()),
                    ("POST", item.post.is_some()),
                    ("DELETE", item.delete.is_some()),
                    ("OPTIONS", item.options.is_some()),
                    ("HEAD", item.head.is_some()),
                    ("PATCH", item.patch.is_some()),
                    ("TRACE", item.trace.is_some()),
                ];
                let allow: Vec<&str> = methods
                    .iter()
                    .filter(|(_, documented)| *documented)
                    .map(|(method, _)| *method)
                    .collect();
                Route {
                    segments,
                    allow: HeaderValue::from_str(&allow.join(", "))
                        .unwrap_or(HeaderValue::from_static("")),
                }
            })
            .collect()
    })
}

/// The `Allow` value of the documented path `path` matches, if any.
fn allowed_on(path: &str) -> Option<&'static HeaderValue> {
    let segments: Vec<&str> = path.split('/').collect();
    routes()
        .iter()
        .find(|route| {
            route.segments.len() == segments.len()
                && route
                    .segments
                    .iter()
                    .zip(&segments)
                    .all(|(template, actual)| match template {
                        Some(literal) => literal == actual,
                        None => !actual.is_empty(),
                    })
        })
        .map(|route| &route.allow)
}

/// The default service: 405 (with `Allow`) or 404.
pub(crate) async fn unrouted(req: HttpRequest) -> HttpResponse {
    let (method, path) = (req.method(), req.path());
    match allowed_on(path) {
        Some(allow) => {
            let mut response = problem_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                format!(
                    "{method} is not allowed on {path}; allowed: {}",
                    allow.to_str().unwrap_or("")
                ),
            );
            response.headers_mut().insert(header::ALLOW, allow.clone());
            response
        }
        None => problem_response(
            StatusCode::NOT_FOUND,
            "not-found",
            "Not found",
            format!("no route matches {path}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_paths_list_their_methods_and_others_have_none() {
        let allow = |path: &str| allowed_on(path).map(|v| v.to_str().unwrap_or("?").to_owned());
        assert_eq!(allow("/admin/policies").as_deref(), Some("GET, POST"));
        assert_eq!(
            allow("/admin/policies/p").as_deref(),
            Some("GET, PUT, DELETE")
        );
        assert_eq!(
            allow("/admin/policies/p/overrides/user%2F42").as_deref(),
            Some("GET, PUT, DELETE")
        );
        assert_eq!(allow("/quota/consume").as_deref(), Some("POST"));
        for unknown in [
            "/",
            "/nope",
            "/admin/policies/",
            "/admin/policies/p/x",
            "/quota",
        ] {
            assert_eq!(allow(unknown), None, "{unknown}");
        }
    }
}
