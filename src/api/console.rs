//! The operator console: one page, its scripts (`app.js`, and `webhooks.js` for the
//! webhooks page) and one style sheet, compiled into the binary and served under
//! `/console/`.
//!
//! The console is a client of the documented API and nothing more: it signs in with the
//! admin token, keeps it in the tab's session storage and sends it as a bearer token; no
//! cookie exists, so no other site can make a browser act with it. Every file is served
//! with a Content-Security-Policy that allows this origin's script, style and API calls
//! and nothing else (no inline script, no foreign origin, no framing), so an injected
//! string can neither run code nor send the token anywhere.

use actix_web::http::header;
use actix_web::{web, HttpResponse};

/// What the console's files may load and call: their own origin only.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The page.
const INDEX: &str = include_str!("console/index.html");
/// The script: pages, API calls and the SVG charts.
const SCRIPT: &str = include_str!("console/app.js");
/// The webhooks page's script, loaded after `app.js` and built on its helpers.
const WEBHOOKS_SCRIPT: &str = include_str!("console/webhooks.js");
/// The style sheet.
const STYLE: &str = include_str!("console/app.css");

/// The console's files: the path each is served at, its content type, and it.
const FILES: [(&str, &str, &str); 4] = [
    ("/console/", "text/html; charset=utf-8", INDEX),
    ("/console/app.js", "text/javascript; charset=utf-8", SCRIPT),
    (
        "/console/webhooks.js",
        "text/javascript; charset=utf-8",
        WEBHOOKS_SCRIPT,
    ),
    ("/console/app.css", "text/css; charset=utf-8", STYLE),
];

/// Registers `/console` (a redirect to `/console/`) and the console's files.
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config.route("/console", web::get().to(redirect));
    for (path, content_type, body) in FILES {
        config.route(path, web::get().to(move || serve(content_type, body)));
    }
}

async fn redirect() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, "/console/"))
        .finish()
}

/// One of the console's files, with the headers that confine it.
async fn serve(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Small files, served from memory: revalidating costs nothing, and an upgraded
        // binary is never paired with a cached script of the previous one.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}
