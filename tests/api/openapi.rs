//! `openapi/openapi.json` is generated from the code; these tests fail when it drifts.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend};

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    std::fs::read_to_string(path).expect("openapi/openapi.json exists")
}

#[test]
fn the_committed_spec_matches_the_code() {
    let generated = quota_ledger::api::openapi::spec_json();
    assert!(
        committed() == generated,
        "openapi/openapi.json is stale: run `cargo run -- openapi > openapi/openapi.json`"
    );
}

#[tokio::test]
async fn the_served_spec_is_the_generated_one_and_documents_the_contract() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let served = app.served_spec().await;
    let generated: serde_json::Value =
        serde_json::from_str(&quota_ledger::api::openapi::spec_json()).unwrap();
    assert_eq!(served, generated);
    assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = served["paths"].as_object().unwrap();
    for (path, method) in [
        ("/quota/consume", "post"),
        ("/quota/check", "post"),
        ("/quota/usage", "get"),
        ("/quota/ledger", "get"),
        ("/admin/policies", "get"),
        ("/admin/policies", "post"),
        ("/admin/policies/{id}", "get"),
        ("/admin/policies/{id}", "put"),
        ("/admin/policies/{id}", "delete"),
        ("/admin/policies/{id}/overrides", "get"),
        ("/admin/policies/{id}/overrides/{subject}", "get"),
        ("/admin/policies/{id}/overrides/{subject}", "put"),
        ("/admin/policies/{id}/overrides/{subject}", "delete"),
        ("/healthz", "get"),
        ("/readyz", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is documented"
        );
    }
    let schemes = &served["components"]["securitySchemes"];
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    assert_eq!(schemes["client_token"]["scheme"], "bearer");
    let consume = &paths["/quota/consume"]["post"]["responses"];
    for status in ["200", "400", "404", "413", "415", "422", "429", "503"] {
        assert!(consume.get(status).is_some(), "consume documents {status}");
    }
}
