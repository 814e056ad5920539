//! HTTP details that API fuzzing (scripts/fuzz.sh) turned up, kept as regressions: 405 with
//! `Allow` on documented paths, strict `If-Match`, JSON Schema integers, and a spec that
//! states the rules the server enforces.

use crate::helpers::{calendar_policy, spawn_app, CounterBackend, PolicyBackend, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::json;

async fn app() -> TestApp {
    spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await
}

#[tokio::test]
async fn a_documented_path_with_an_undocumented_method_is_405_listing_the_allowed_ones() {
    let app = app().await;
    for (method, path, allow) in [
        (Method::DELETE, "/quota/consume", "POST"),
        (Method::GET, "/quota/check", "POST"),
        (Method::TRACE, "/admin/policies", "GET, POST"),
        (Method::PATCH, "/admin/policies/p", "GET, PUT, DELETE"),
        (
            Method::POST,
            "/admin/policies/p/overrides/user%2F1",
            "GET, PUT, DELETE",
        ),
        (Method::OPTIONS, "/healthz", "GET"),
    ] {
        let answer = app.send(app.admin(method.clone(), path)).await;
        answer.assert_problem(405);
        assert_eq!(answer.header("allow"), Some(allow), "{method} {path}");
    }
    for path in ["/admin/policies/", "/admin/policies/p/nothing", "/quota"] {
        app.send(app.admin(Method::PATCH, path))
            .await
            .assert_problem(404);
    }
}

#[tokio::test]
async fn if_match_takes_strong_entity_tags_and_a_malformed_one_is_400() {
    let app = app().await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let put = |if_match: &str, limit: u64| {
        app.admin(Method::PUT, "/admin/policies/p")
            .header("if-match", if_match)
            .json(&calendar_policy("p", "a", limit, "day", "UTC"))
    };
    for malformed in ["1", "\"1", "W/1", "\"1\" \"2\"", "\"1\",", "*, \"1\""] {
        app.send(put(malformed, 99)).await.assert_problem(400);
    }
    for stale in ["W/\"1\"", "\"abc\"", "\"2\", \"3\""] {
        app.send(put(stale, 99)).await.assert_problem(412);
    }
    assert_eq!(app.admin_get("/admin/policies/p").await.body["limit"], 10);

    let listed = app.send(put("\"9\" ,\"1\"", 20)).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let any = app.send(put("*", 30)).await;
    assert_eq!(any.status, StatusCode::OK, "{}", any.body);
    assert_eq!(any.body["version"], 3);

    let delete = |if_match: &str| {
        app.admin(Method::DELETE, "/admin/policies/p")
            .header("if-match", if_match)
    };
    app.send(delete("3")).await.assert_problem(400);
    app.send(delete("\"2\"")).await.assert_problem(412);
    assert_eq!(
        app.send(delete("\"3\"")).await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn whole_numbers_may_be_written_with_a_fraction_or_an_exponent() {
    let app = app().await;
    let created = app
        .create_policy(
            json!({"id": "p", "action": "a", "measure": "amount", "limit": 1e3,
            "window": {"type": "rolling", "seconds": 3600.0, "bucket_seconds": 6e1}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["limit"], 1000);
    assert_eq!(created.body["window"]["seconds"], 3600);
    assert_eq!(created.body["window"]["bucket_seconds"], 60);

    let consumed = app
        .quota(
            "/quota/consume",
            json!({"action": "a", "subject": "s", "amount": 250.0}),
        )
        .await;
    assert_eq!(consumed.status, StatusCode::OK, "{}", consumed.body);
    assert_eq!(consumed.body["amount"], 250);
    for fractional in [json!(0.5), json!(250.25), json!(1e-3)] {
        let answer = app
            .quota(
                "/quota/consume",
                json!({"action": "a", "subject": "s", "amount": fractional}),
            )
            .await;
        assert_eq!(answer.assert_problem(422)["errors"][0]["field"], "amount");
    }
    let override_ = app
        .send(
            app.admin(Method::PUT, "/admin/policies/p/overrides/s")
                .json(&json!({"limit": 2e3})),
        )
        .await;
    assert_eq!(override_.status, StatusCode::CREATED, "{}", override_.body);
    assert_eq!(override_.body["limit"], 2000);
}

#[tokio::test]
async fn the_spec_states_the_rules_the_server_enforces() {
    let app = app().await;
    let spec = app.served_spec().await;
    let schemas = &spec["components"]["schemas"];
    assert_eq!(schemas["Slug"]["pattern"], "^[a-z0-9._-]+$");
    assert_eq!(schemas["Slug"]["maxLength"], 64);
    assert_eq!(schemas["Subject"]["maxLength"], 256);
    // Time zones are a pattern, not an enum whose names collide as identifiers; every
    // name the server knows fits it.
    assert_eq!(schemas["TimeZone"]["type"], "string");
    assert!(schemas["TimeZone"].get("enum").is_none());
    assert_eq!(schemas["TimeZone"]["pattern"], "^[A-Za-z][A-Za-z0-9_+/-]*$");
    for zone in chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name()) {
        let fits = zone.len() <= 64
            && zone.starts_with(|c: char| c.is_ascii_alphabetic())
            && zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_+/-".contains(c));
        assert!(fits, "{zone} does not fit the TimeZone schema");
    }
    for variant in schemas["WindowDto"]["oneOf"].as_array().unwrap() {
        assert_eq!(variant["additionalProperties"], false, "{variant}");
    }
    assert_eq!(schemas["ConsumeInput"]["additionalProperties"], false);
    assert_eq!(schemas["IdempotencyKey"]["maxLength"], 128);
    assert!(
        schemas["ConsumeInput"]["properties"]["idempotency_key"]
            .to_string()
            .contains("IdempotencyKey"),
        "idempotency keys are documented with their bounds"
    );
    let create = &spec["paths"]["/admin/policies"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    assert_eq!(create["$ref"], "#/components/schemas/NewPolicyInput");
    let new_policy = &schemas["NewPolicyInput"];
    assert!(
        new_policy.get("allOf").is_none(),
        "one object: {new_policy}"
    );
    assert_eq!(new_policy["required"][0], "id");
    assert_eq!(
        new_policy["properties"]["id"]["$ref"],
        "#/components/schemas/Slug"
    );
    let usage = spec["paths"]["/quota/usage"]["get"]["parameters"]
        .as_array()
        .unwrap();
    for parameter in usage {
        let required = parameter["name"] == "action" || parameter["name"] == "subject";
        assert_eq!(parameter["required"] == true, required, "{parameter}");
    }
    let attributes = usage.iter().find(|p| p["name"] == "attributes").unwrap();
    assert_eq!(attributes["style"], "deepObject", "{attributes}");
    assert_eq!(attributes["explode"], true, "{attributes}");
}

/// What client generators need of the document: they take it literally.
#[tokio::test]
async fn the_spec_is_shaped_for_client_generators() {
    let app = app().await;
    let spec = app.served_spec().await;
    let schemas = &spec["components"]["schemas"];
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let at = format!("{method} {path}");
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let schema = parameter["schema"].to_string();
                assert!(!schema.contains("null"), "{at}: {parameter}");
            }
            let security = &operation["security"];
            match path.starts_with("/admin/") {
                true => assert_eq!(security, &json!([{"admin_token": []}]), "{at}"),
                false => assert!(security.is_null(), "{at} declares {security}"),
            }
            for (status, response) in operation["responses"].as_object().unwrap() {
                let header = match status.as_str() {
                    "401" => "WWW-Authenticate",
                    "503" | "429" => "Retry-After",
                    _ => continue,
                };
                assert!(
                    response["headers"].get(header).is_some(),
                    "{at} {status} lacks {header}"
                );
            }
        }
    }
    for answer in [
        "HoldAnswer",
        "ConsumeAnswer",
        "LedgerList",
        "OverrideOut",
        "PolicyOut",
    ] {
        let schema = &schemas[answer];
        let mut properties: Vec<&String> =
            schema["properties"].as_object().unwrap().keys().collect();
        let mut required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        properties.sort();
        required.sort_unstable();
        assert_eq!(
            properties.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            required,
            "{answer}: every property is always sent"
        );
    }
    for field in [
        "consumption_id",
        "hold_id",
        "expires_at",
        "retry_after_seconds",
    ] {
        assert!(
            schemas["HoldAnswer"]["properties"][field]
                .to_string()
                .contains("null"),
            "{field} is nullable"
        );
    }
    let commit = &spec["paths"]["/quota/holds/{id}/commit"]["post"]["requestBody"];
    assert_eq!(commit["required"], false);
    assert_eq!(
        commit["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/CommitInput"
    );
    let metrics = &spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
    let served = app
        .client
        .get(format!("{}/metrics", app.address))
        .send()
        .await
        .unwrap();
    let content_type = served.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        metrics.get(&content_type).is_some(),
        "{content_type} not in {metrics}"
    );
}
