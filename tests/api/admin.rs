//! The admin API over real HTTP, on SQLite and on Postgres.

use crate::helpers::{
    calendar_policy, spawn_app, spawn_with, Answer, CounterBackend, PolicyBackend,
};
use crate::on_policy_stores;
use reqwest::{Method, StatusCode};
use serde_json::json;

async fn a_created_policy_reads_back_with_location_and_etag(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let body = json!({"id": "transfer-usd-daily", "action": "transfer", "measure": "amount",
        "unit": "USD cents", "limit": 200000, "description": "two thousand dollars",
        "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600}});
    let created = app.create_policy(body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(
        created.header("location"),
        Some("/admin/policies/transfer-usd-daily")
    );
    assert_eq!(created.header("etag"), Some("\"1\""));
    assert_eq!(created.body["version"], 1);
    assert_eq!(created.body["mode"], "enforce");
    assert_eq!(created.body["enabled"], true);
    assert_eq!(created.body["ledger_denials"], false);

    let read = app.admin_get("/admin/policies/transfer-usd-daily").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.header("etag"), Some("\"1\""));
    assert_eq!(read.body, created.body, "what is read is what was created");
}

async fn a_calendar_policy_defaults_to_utc(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let body = json!({"id": "p", "action": "a", "measure": "count", "limit": 1,
        "window": {"type": "calendar", "period": "day"}});
    let created = app.must_create_policy(body).await;
    assert_eq!(created["window"]["timezone"], "UTC");
}

async fn a_duplicate_id_is_a_conflict(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let again = app
        .create_policy(calendar_policy("p", "b", 5, "hour", "UTC"))
        .await;
    again.assert_problem(409);
    let read = app.admin_get("/admin/policies/p").await;
    assert_eq!(read.body["action"], "a", "the original is untouched");
}

async fn the_list_filters_by_action(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p1", "sms.send", 10, "day", "UTC"))
        .await;
    app.must_create_policy(calendar_policy("p2", "sms.send", 100, "month", "UTC"))
        .await;
    app.must_create_policy(calendar_policy("p3", "transfer", 5, "day", "UTC"))
        .await;
    let all = app.admin_get("/admin/policies").await;
    assert_eq!(all.body["items"].as_array().map(Vec::len), Some(3));
    assert_eq!(all.body["next_cursor"], serde_json::Value::Null);
    let sms = app.admin_get("/admin/policies?action=sms.send").await;
    let ids: Vec<&str> = sms.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["p1", "p2"]);
}

async fn put_replaces_and_honours_if_match(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let path = "/admin/policies/p";

    let replaced = app
        .send(
            app.admin(Method::PUT, path)
                .header("if-match", "\"1\"")
                .json(&calendar_policy("p", "a", 20, "day", "UTC")),
        )
        .await;
    assert_eq!(replaced.status, StatusCode::OK, "{}", replaced.body);
    assert_eq!(replaced.body["version"], 2);
    assert_eq!(replaced.body["limit"], 20);
    assert_eq!(replaced.header("etag"), Some("\"2\""));

    let stale = app
        .send(
            app.admin(Method::PUT, path)
                .header("if-match", "\"1\"")
                .json(&calendar_policy("p", "a", 30, "day", "UTC")),
        )
        .await;
    stale.assert_problem(412);
    assert_eq!(
        app.admin_get(path).await.body["limit"],
        20,
        "a stale write changes nothing"
    );

    let no_if_match = app
        .send(
            app.admin(Method::PUT, path)
                .json(&json!({"action": "a", "measure": "count", "limit": 40,
            "window": {"type": "token_bucket", "seconds": 60}})),
        )
        .await;
    assert_eq!(no_if_match.status, StatusCode::OK, "{}", no_if_match.body);
    assert_eq!(no_if_match.body["version"], 3);
    assert_eq!(no_if_match.body["window"]["type"], "token_bucket");

    let other_id = app
        .send(
            app.admin(Method::PUT, path)
                .json(&calendar_policy("q", "a", 1, "day", "UTC")),
        )
        .await;
    other_id.assert_problem(422);
    let unknown = app
        .send(
            app.admin(Method::PUT, "/admin/policies/nope")
                .json(&calendar_policy("nope", "a", 1, "day", "UTC")),
        )
        .await;
    unknown.assert_problem(404);
}

async fn delete_honours_if_match_and_removes_overrides(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let put = app
        .send(
            app.admin(Method::PUT, "/admin/policies/p/overrides/user-1")
                .json(&json!({"limit": 50})),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED);

    let stale = app
        .send(
            app.admin(Method::DELETE, "/admin/policies/p")
                .header("if-match", "\"7\""),
        )
        .await;
    stale.assert_problem(412);
    let deleted = app
        .send(
            app.admin(Method::DELETE, "/admin/policies/p")
                .header("if-match", "\"1\""),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    app.admin_get("/admin/policies/p").await.assert_problem(404);
    app.send(app.admin(Method::DELETE, "/admin/policies/p"))
        .await
        .assert_problem(404);

    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let overrides = app.admin_get("/admin/policies/p/overrides").await;
    assert_eq!(
        overrides.body["items"],
        json!([]),
        "overrides went with the policy"
    );
}

async fn overrides_can_be_created_replaced_read_and_deleted(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    // A subject with characters that need escaping in a URL and in Redis keys.
    let subject = "user {42}/ü";
    let path = "/admin/policies/p/overrides/user%20%7B42%7D%2F%C3%BC";

    let created = app
        .send(
            app.admin(Method::PUT, path)
                .json(&json!({"limit": 50, "note": "VIP", "expires_at": "2030-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["subject"], subject);
    assert_eq!(created.body["limit"], 50);

    let replaced = app
        .send(app.admin(Method::PUT, path).json(&json!({"limit": 70})))
        .await;
    assert_eq!(replaced.status, StatusCode::OK);
    assert_eq!(replaced.body["limit"], 70);
    assert_eq!(replaced.body["expires_at"], serde_json::Value::Null);
    assert_eq!(replaced.body["created_at"], created.body["created_at"]);

    let read = app.admin_get(path).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body["limit"], 70);
    let list = app.admin_get("/admin/policies/p/overrides").await;
    assert_eq!(list.body["items"].as_array().map(Vec::len), Some(1));

    let deleted = app.send(app.admin(Method::DELETE, path)).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    app.admin_get(path).await.assert_problem(404);
    app.send(app.admin(Method::DELETE, path))
        .await
        .assert_problem(404);
    app.send(
        app.admin(Method::PUT, "/admin/policies/nope/overrides/x")
            .json(&json!({"limit": 1})),
    )
    .await
    .assert_problem(404);
    let negative = app
        .send(app.admin(Method::PUT, path).json(&json!({"limit": -1})))
        .await;
    assert_eq!(negative.assert_problem(422)["errors"][0]["field"], "limit");
}

async fn invalid_policies_are_rejected_with_the_offending_field(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let day = json!({"type": "calendar", "period": "day"});
    let cases = [
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1,
            "window": {"type": "calendar", "period": "day", "timezone": "Mars/Olympus"}}),
            "window.timezone",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 9007199254740992_i64, "window": day}),
            "limit",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": -5, "window": day}),
            "limit",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1,
            "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 7000}}),
            "window.bucket_seconds",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1,
            "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 1}}),
            "window.bucket_seconds",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1,
            "window": {"type": "rolling", "seconds": 0, "bucket_seconds": 1}}),
            "window.seconds",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 9007199254740991_i64,
            "window": {"type": "token_bucket", "seconds": 3600}}),
            "limit",
        ),
        (
            json!({"id": "Not Valid", "action": "a", "measure": "count", "limit": 1, "window": day}),
            "id",
        ),
        (
            json!({"id": "p", "action": "A!", "measure": "count", "limit": 1, "window": day}),
            "action",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "weight", "limit": 1, "window": day}),
            "measure",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1, "window": {"type": "sundial"}}),
            "window",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": "ten", "window": day}),
            "limit",
        ),
        (
            json!({"action": "a", "measure": "count", "limit": 1, "window": day}),
            "id",
        ),
        (
            json!({"id": "p", "action": "a", "measure": "count", "limit": 1, "window": day, "colour": "red"}),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let answer = app.create_policy(body.clone()).await;
        let problem = answer.assert_problem(422);
        let fields: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("422 lists errors: {problem}"))
            .iter()
            .filter_map(|e| e["field"].as_str())
            .collect();
        assert!(
            fields
                .iter()
                .any(|f| f.starts_with(field) || field.starts_with(f)),
            "{body} should blame {field}, blamed {fields:?}"
        );
    }
    let list = app.admin_get("/admin/policies").await;
    assert_eq!(list.body["items"], json!([]), "nothing invalid was stored");
}

async fn the_admin_api_needs_the_admin_token(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let url = format!("{}/admin/policies", app.address);
    let missing = app.send(app.client.get(&url)).await;
    missing.assert_problem(401);
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    app.send(app.client.get(&url).bearer_auth("wrong"))
        .await
        .assert_problem(401);
    app.send(
        app.client
            .post(&url)
            .bearer_auth("test-admin-tokeX")
            .json(&calendar_policy("p", "a", 1, "day", "UTC")),
    )
    .await
    .assert_problem(401);
    assert_eq!(
        app.admin_get("/admin/policies").await.body["items"],
        json!([])
    );
}

/// Forty creates for one action at once, split over two instances sharing the policy
/// database: the store refuses all but 32 of them, whatever the interleaving.
async fn concurrent_creates_never_give_an_action_more_than_32_policies(store: PolicyBackend) {
    let first = spawn_app(store, CounterBackend::Memory).await;
    let second = spawn_with(first.settings.clone()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let app = if i % 2 == 0 { &first } else { &second };
        let request = app
            .admin(Method::POST, "/admin/policies")
            .json(&calendar_policy(&format!("p{i:02}"), "a", 10, "day", "UTC"));
        tasks.spawn(async move { request.send().await });
    }
    let (mut created, mut refused) = (0, 0);
    while let Some(sent) = tasks.join_next().await {
        let answer = Answer::read(sent.unwrap().unwrap()).await;
        if answer.status == StatusCode::CREATED {
            created += 1;
        } else {
            let detail = &answer.assert_problem(409)["detail"];
            assert_eq!(
                detail,
                "action 'a' has 32 policies already, the most one action may have"
            );
            refused += 1;
        }
    }
    assert_eq!((created, refused), (32, 8));
    for app in [&first, &second] {
        let listed = app.admin_get("/admin/policies?action=a").await;
        assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(32));
    }
}

async fn policies_survive_a_restart(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let created = app
        .must_create_policy(calendar_policy("p", "a", 10, "week", "Europe/Berlin"))
        .await;
    let again = app.restart().await;
    let read = again.admin_get("/admin/policies/p").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body, created);
}

#[tokio::test]
async fn a_malformed_if_match_is_400_and_changes_nothing() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let created = app
        .must_create_policy(calendar_policy("p", "a", 10, "day", "UTC"))
        .await;
    let malformed: [&[u8]; 14] = [
        b"1",
        b"3",
        b"\"1",
        b"1\"",
        b"W/",
        b"W/1",
        b"",
        b"\"1\" \"2\"",
        b"\"1\",",
        b"\"1\", garbage",
        b"\"1\",,\"2\"",
        b"*, \"1\"",
        b"\"a b\"",
        b"\"\xff\"",
    ];
    for value in malformed {
        let value = reqwest::header::HeaderValue::from_bytes(value).unwrap();
        let put = app
            .send(
                app.admin(Method::PUT, "/admin/policies/p")
                    .header("if-match", value.clone())
                    .json(&calendar_policy("p", "a", 99, "day", "UTC")),
            )
            .await;
        let delete = app
            .send(
                app.admin(Method::DELETE, "/admin/policies/p")
                    .header("if-match", value.clone()),
            )
            .await;
        for answer in [put, delete] {
            assert_eq!(
                answer.assert_problem(400)["detail"],
                "If-Match must be * or a list of entity tags such as \"3\"",
                "If-Match: {value:?}"
            );
        }
    }
    let read = app.admin_get("/admin/policies/p").await;
    assert_eq!(
        read.body, created,
        "neither a PUT nor a DELETE went through"
    );
}

on_policy_stores!(
    a_created_policy_reads_back_with_location_and_etag,
    a_calendar_policy_defaults_to_utc,
    a_duplicate_id_is_a_conflict,
    the_list_filters_by_action,
    put_replaces_and_honours_if_match,
    delete_honours_if_match_and_removes_overrides,
    overrides_can_be_created_replaced_read_and_deleted,
    invalid_policies_are_rejected_with_the_offending_field,
    the_admin_api_needs_the_admin_token,
    policies_survive_a_restart,
    concurrent_creates_never_give_an_action_more_than_32_policies,
);

#[tokio::test]
async fn an_action_takes_at_most_32_policies() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    for i in 0..32 {
        app.must_create_policy(calendar_policy(&format!("p{i}"), "a", 10, "day", "UTC"))
            .await;
    }
    app.create_policy(calendar_policy("p32", "a", 10, "day", "UTC"))
        .await
        .assert_problem(409);
    app.must_create_policy(calendar_policy("elsewhere", "b", 10, "day", "UTC"))
        .await;
    let moved = app
        .send(
            app.admin(Method::PUT, "/admin/policies/elsewhere")
                .json(&calendar_policy("elsewhere", "a", 1, "day", "UTC")),
        )
        .await;
    moved.assert_problem(409);
    let same = app
        .send(
            app.admin(Method::PUT, "/admin/policies/p0")
                .json(&calendar_policy("p0", "a", 11, "day", "UTC")),
        )
        .await;
    assert_eq!(
        same.status,
        StatusCode::OK,
        "replacing one of the 32 is fine"
    );
}
