//! Every error is problem+json, including actix's own; Swagger UI is served locally.

use crate::helpers::{calendar_policy, spawn_app, CounterBackend, PolicyBackend};
use reqwest::{Method, StatusCode};

#[tokio::test]
async fn bodies_over_64_kib_are_rejected_with_413() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let mut policy = calendar_policy("p", "a", 1, "day", "UTC");
    policy["description"] = "x".repeat(70 * 1024).into();
    app.create_policy(policy).await.assert_problem(413);
    assert_eq!(
        app.admin_get("/admin/policies").await.body["items"],
        serde_json::json!([])
    );
}

#[tokio::test]
async fn a_body_that_is_not_json_is_rejected_with_415() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let answer = app
        .send(
            app.admin(Method::POST, "/admin/policies")
                .header("content-type", "text/plain")
                .body("id=p"),
        )
        .await;
    answer.assert_problem(415);
    let no_type = app
        .send(app.admin(Method::POST, "/admin/policies").body("{}"))
        .await;
    no_type.assert_problem(415);
}

#[tokio::test]
async fn malformed_json_is_rejected_with_400() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    for body in ["{", "{\"id\": }", "[1, 2", "{} trailing"] {
        let answer = app
            .send(
                app.admin(Method::POST, "/admin/policies")
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await;
        answer.assert_problem(400);
    }
}

#[tokio::test]
async fn unknown_routes_are_404_problems() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    for path in ["/nope", "/admin/nothing", "/quota"] {
        let answer = app
            .send(app.client.get(format!("{}{path}", app.address)))
            .await;
        answer.assert_problem(404);
    }
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let health = app
        .send(app.client.get(format!("{}/healthz", app.address)))
        .await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body["status"], "ok");
    let ready = app
        .send(app.client.get(format!("{}/readyz", app.address)))
        .await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.body["stores"]["policy_store"], "ok");
    assert_eq!(ready.body["stores"]["counter_store"], "embedded");
}

#[tokio::test]
async fn swagger_ui_and_its_assets_are_served_from_the_binary() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let page = app
        .client
        .get(format!("{}/swagger-ui/", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    assert!(!html.contains("https://"), "no CDN: every asset is local");
    for asset in [
        "swagger-ui-bundle.js",
        "swagger-ui.css",
        "swagger-initializer.js",
    ] {
        let response = app
            .client
            .get(format!("{}/swagger-ui/{asset}", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{asset}");
        assert!(
            response.bytes().await.unwrap().len() > 100,
            "{asset} has content"
        );
    }
    let initializer = app
        .client
        .get(format!("{}/swagger-ui/swagger-initializer.js", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        initializer.contains("/api-docs/openapi.json"),
        "{initializer}"
    );
}

#[tokio::test]
async fn client_tokens_protect_the_quota_endpoints_when_set() {
    use crate::helpers::{fresh_settings, spawn_with};
    use quota_ledger::config::Secret;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.client_tokens = vec![Secret::new("client-one"), Secret::new("client-two")];
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let consume = |token: Option<&str>| {
        let request = app
            .client
            .post(format!("{}/quota/consume", app.address))
            .json(&serde_json::json!({"action": "a", "subject": "s"}));
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    };
    app.send(consume(None)).await.assert_problem(401);
    app.send(consume(Some("client-three")))
        .await
        .assert_problem(401);
    app.send(consume(Some(crate::helpers::ADMIN_TOKEN)))
        .await
        .assert_problem(401);
    assert_eq!(
        app.send(consume(Some("client-one"))).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.send(consume(Some("client-two"))).await.status,
        StatusCode::OK
    );
    let usage = app
        .send(
            app.client
                .get(format!("{}/quota/usage?action=a&subject=s", app.address))
                .bearer_auth("client-two"),
        )
        .await;
    assert_eq!(
        usage.body["policies"][0]["used"], 2,
        "only the authorised consumes charged"
    );
}
