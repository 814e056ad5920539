//! The operator console's files: served from the binary under `/console/`, each confined
//! by a Content-Security-Policy. (`scripts/console.sh` drives the console itself in a
//! headless browser.)

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend};
use reqwest::header;

#[tokio::test]
async fn the_console_is_served_from_the_binary_with_a_strict_content_security_policy() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    for (path, media_type, marker) in [
        ("/console/", "text/html", "<script src=\"app.js\""),
        ("/console/app.js", "text/javascript", "sessionStorage"),
        ("/console/webhooks.js", "text/javascript", "/admin/webhooks"),
        ("/console/app.css", "text/css", "{"),
    ] {
        let response = app
            .client
            .get(format!("{}{path}", app.address))
            .send()
            .await
            .expect("requesting the console");
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        let value = |name: header::HeaderName| {
            headers
                .get(&name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{path}: no {name}"))
                .to_owned()
        };
        assert!(
            value(header::CONTENT_TYPE).starts_with(media_type),
            "{path}"
        );
        let policy = value(header::CONTENT_SECURITY_POLICY);
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe-inline"), "{path}: {policy}");
        assert_eq!(value(header::X_CONTENT_TYPE_OPTIONS), "nosniff", "{path}");
        let body = response.text().await.expect("reading the body");
        assert!(body.contains(marker), "{path}: no {marker:?}");
    }
    // The page has no inline script or style for the policy to forbid.
    let page = app
        .client
        .get(format!("{}/console/", app.address))
        .send()
        .await
        .expect("requesting the console")
        .text()
        .await
        .expect("reading the page");
    let markup = without_comments(&page);
    assert!(!markup.contains("style=\""), "no inline style attribute");
    assert!(!markup.contains("<script>"), "no inline script");
    assert!(!markup.contains("<style"), "no inline style sheet");

    let redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
        .get(format!("{}/console", app.address))
        .send()
        .await
        .expect("requesting /console");
    assert_eq!(redirect.status(), 308);
    assert_eq!(
        redirect
            .headers()
            .get(header::LOCATION)
            .map(|v| v.as_bytes()),
        Some(&b"/console/"[..])
    );
    let missing = app
        .send(app.client.get(format!("{}/console/nope.js", app.address)))
        .await;
    missing.assert_problem(404);
}

/// `html` without its `<!-- … -->` comments.
fn without_comments(html: &str) -> String {
    let mut rest = html;
    let mut markup = String::new();
    while let Some(start) = rest.find("<!--") {
        markup.push_str(&rest[..start]);
        rest = rest[start..]
            .find("-->")
            .map_or("", |end| &rest[start + end + 3..]);
    }
    markup.push_str(rest);
    markup
}
