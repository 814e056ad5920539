//! API keys: confined to their actions and operations on every endpoint, revoked on every
//! instance within a second, refused once expired, kept only as a hash, and the first one
//! closes the quota endpoints.

use crate::helpers::{
    calendar_policy, eventually, fresh_settings, spawn_app, spawn_with, Answer, CounterBackend,
    PolicyBackend, TestApp,
};
use quota_ledger::config::Secret;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `POST /admin/keys` with the admin token.
async fn create_key(app: &TestApp, body: Value) -> Answer {
    app.send(app.admin(Method::POST, "/admin/keys").json(&body))
        .await
}

/// Creates a key and returns its secret and id.
async fn must_create_key(app: &TestApp, body: Value) -> (String, String) {
    let answer = create_key(app, body).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let key = answer.body["key"]
        .as_str()
        .expect("the key, once")
        .to_owned();
    let id = answer.body["id"].as_str().expect("an id").to_owned();
    (key, id)
}

/// A request to `path` with `key` as the bearer token.
fn with_key(app: &TestApp, key: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
    app.client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(key)
}

/// `POST path` with `body` and `key`.
async fn post(app: &TestApp, key: &str, path: &str, body: Value) -> Answer {
    app.send(with_key(app, key, Method::POST, path).json(&body))
        .await
}

/// `GET path` with `key`.
async fn get(app: &TestApp, key: &str, path: &str) -> Answer {
    app.send(with_key(app, key, Method::GET, path)).await
}

fn consume_body(action: &str, subject: &str, amount: u64) -> Value {
    json!({"action": action, "subject": subject, "amount": amount})
}

/// The actions of every ledger entry `key` reads (one page is enough here), once the
/// Redis streams (if any) have been moved into SQL.
async fn ledger_actions(app: &TestApp, key: &str, query: &str) -> Vec<String> {
    app.engine.drain_ledger_now().await;
    let page = get(app, key, &format!("/quota/ledger?{query}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| e["action"].as_str().unwrap_or("").to_owned())
        .collect()
}

async fn a_key_acts_only_on_its_actions_everywhere(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Sqlite, counters).await;
    for (id, action) in [
        ("sms", "sms.send"),
        ("sms-eu", "sms.eu.send"),
        ("transfer", "transfer"),
    ] {
        let mut policy = calendar_policy(id, action, 1_000, "day", "UTC");
        policy["measure"] = json!("amount");
        app.must_create_policy(policy).await;
    }
    let admin_token = crate::helpers::ADMIN_TOKEN;
    let (sms, _) =
        must_create_key(&app, json!({"name": "sms backend", "actions": ["sms.*"]})).await;
    let (payments, _) =
        must_create_key(&app, json!({"name": "payments", "actions": ["transfer"]})).await;

    // sms.* consumes sms.send; transfer (and sms.eu.send: '*' stays within a segment) is 403.
    let allowed = post(
        &app,
        &sms,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.body);
    for action in ["transfer", "sms.eu.send"] {
        let refused = post(&app, &sms, "/quota/consume", consume_body(action, "u", 1)).await;
        let problem = refused.assert_problem(403);
        assert_eq!(problem["type"], "urn:quota-ledger:problem:forbidden");
        assert!(
            problem["detail"].as_str().unwrap_or("").contains(action),
            "the 403 names the action: {problem}"
        );
        let checked = post(&app, &sms, "/quota/check", consume_body(action, "u", 1)).await;
        checked.assert_problem(403);
    }

    // The payments key's consumption and hold: the sms key cannot refund, commit or
    // release them (404, as if they did not exist), and nothing changes.
    let charged = post(
        &app,
        &payments,
        "/quota/consume",
        consume_body("transfer", "u", 300),
    )
    .await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    let consumption = charged.body["consumption_id"].as_str().unwrap().to_owned();
    let held = post(
        &app,
        &payments,
        "/quota/holds",
        json!({"action": "transfer", "subject": "u", "amount": 200, "ttl_seconds": 600}),
    )
    .await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    let hold = held.body["hold_id"].as_str().unwrap().to_owned();
    let before = ledger_actions(&app, admin_token, "subject=u").await;
    let used = |answer: Answer| answer.body["policies"][0]["used"].clone();
    let usage_path = "/quota/usage?action=transfer&subject=u";
    let usage_before = used(get(&app, admin_token, usage_path).await);
    assert_eq!(usage_before, json!(500));

    let refund = post(
        &app,
        &sms,
        "/quota/refund",
        json!({"consumption_id": consumption}),
    )
    .await;
    refund.assert_problem(404);
    for step in ["commit", "release"] {
        let settled = post(
            &app,
            &sms,
            &format!("/quota/holds/{hold}/{step}"),
            json!({}),
        )
        .await;
        settled.assert_problem(404);
    }
    assert_eq!(
        used(get(&app, admin_token, usage_path).await),
        usage_before,
        "nothing changed"
    );
    assert_eq!(
        ledger_actions(&app, admin_token, "subject=u").await,
        before,
        "no entry written"
    );

    // Its owner still can: the 404s above were about the key, not the consumption.
    let refund = post(
        &app,
        &payments,
        "/quota/refund",
        json!({"consumption_id": consumption}),
    )
    .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    let released = post(
        &app,
        &payments,
        &format!("/quota/holds/{hold}/release"),
        json!({}),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);

    // Reads: usage of another action is 403; the ledger shows only sms.*.
    let usage = get(&app, &sms, "/quota/usage?action=transfer&subject=u").await;
    usage.assert_problem(403);
    let usage = get(&app, &sms, "/quota/usage?action=sms.send&subject=u").await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    let everything = ledger_actions(&app, admin_token, "").await;
    assert!(everything.iter().any(|a| a == "transfer"), "{everything:?}");
    let seen = ledger_actions(&app, &sms, "").await;
    assert_eq!(seen, vec!["sms.send".to_owned()], "only sms.*: {seen:?}");
    get(&app, &sms, "/quota/ledger?action=transfer")
        .await
        .assert_problem(403);
    let theirs = ledger_actions(&app, &payments, "").await;
    assert!(
        theirs.iter().all(|a| a == "transfer") && theirs.len() == 4,
        "{theirs:?}"
    );
}

crate::on_counter_stores!(a_key_acts_only_on_its_actions_everywhere);

#[tokio::test]
async fn a_key_uses_only_its_operations_and_never_changes_admin() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms", "sms.send", 10, "day", "UTC"))
        .await;
    let (consume_only, _) = must_create_key(
        &app,
        json!({"name": "sender", "actions": ["sms.send"], "operations": ["consume"]}),
    )
    .await;
    let charged = post(
        &app,
        &consume_only,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    let consumption = charged.body["consumption_id"].clone();
    let refund = post(
        &app,
        &consume_only,
        "/quota/refund",
        json!({"consumption_id": consumption}),
    )
    .await;
    let problem = refund.assert_problem(403);
    assert!(
        problem["detail"].as_str().unwrap_or("").contains("refund"),
        "{problem}"
    );
    get(&app, &consume_only, "/quota/ledger")
        .await
        .assert_problem(403);
    get(&app, &consume_only, "/admin/policies")
        .await
        .assert_problem(403);

    // admin:read lists policies (and keys), but cannot change one.
    let (reader, _) = must_create_key(
        &app,
        json!({"name": "auditor", "actions": ["sms.*"], "operations": ["admin:read", "ledger"]}),
    )
    .await;
    let who = get(&app, &reader, "/admin/whoami").await;
    assert_eq!(
        (
            &who.body["kind"],
            &who.body["may_change"],
            &who.body["name"]
        ),
        (&json!("api_key"), &json!(false), &json!("auditor")),
        "{}",
        who.body
    );
    let admin = app.admin_get("/admin/whoami").await;
    assert_eq!(admin.body["may_change"], true, "{}", admin.body);
    get(&app, &consume_only, "/admin/whoami")
        .await
        .assert_problem(403);
    let listed = get(&app, &reader, "/admin/policies").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body["items"][0]["id"], "sms");
    let keys = get(&app, &reader, "/admin/keys").await;
    assert_eq!(keys.status, StatusCode::OK);
    let text = keys.body.to_string();
    assert!(
        !text.contains(&consume_only) && !text.contains(&reader),
        "no secret is listed"
    );
    let changed = app
        .send(
            with_key(&app, &reader, Method::PUT, "/admin/policies/sms")
                .header("If-Match", "\"1\"")
                .json(&calendar_policy("sms", "sms.send", 99, "day", "UTC")),
        )
        .await;
    changed.assert_problem(403);
    let deleted = app
        .send(
            with_key(&app, &reader, Method::DELETE, "/admin/policies/sms").header("If-Match", "*"),
        )
        .await;
    deleted.assert_problem(403);
    post(
        &app,
        &reader,
        "/admin/keys",
        json!({"name": "x", "actions": ["*"]}),
    )
    .await
    .assert_problem(403);
    let policy = app.admin_get("/admin/policies/sms").await;
    assert_eq!(policy.body["limit"], 10, "unchanged");
    // A key is not the admin token: not even consume on /quota/* for the reader.
    post(
        &app,
        &reader,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await
    .assert_problem(403);
}

#[tokio::test]
async fn the_first_key_closes_open_quota_endpoints_and_client_tokens_keep_full_access() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms", "sms.send", 10, "day", "UTC"))
        .await;
    assert_eq!(
        app.consume("sms.send", "u", 1).await.status,
        StatusCode::OK,
        "open"
    );
    let first = create_key(&app, json!({"name": "first", "actions": ["sms.*"]})).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body["closed_quota_endpoints"], true, "{}", first.body);
    app.consume("sms.send", "u", 1).await.assert_problem(401);
    let second = create_key(&app, json!({"name": "second", "actions": ["sms.*"]})).await;
    assert_eq!(second.body["closed_quota_endpoints"], false);
    // Revoking every key does not reopen them.
    for answer in [&first, &second] {
        let id = answer.body["id"].as_str().unwrap();
        let revoked = app
            .send(app.admin(Method::DELETE, &format!("/admin/keys/{id}")))
            .await;
        assert_eq!(revoked.body["state"], "revoked", "{}", revoked.body);
    }
    app.consume("sms.send", "u", 1).await.assert_problem(401);
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("quota_auth_failures_total{reason=\"missing\"} 2"),
        "{metrics}"
    );

    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.client_tokens = vec![Secret::new("full-access")];
    let tokens = spawn_with(settings).await;
    tokens
        .must_create_policy(calendar_policy("t", "transfer", 10, "day", "UTC"))
        .await;
    let (sms, _) = must_create_key(&tokens, json!({"name": "sms", "actions": ["sms.*"]})).await;
    let full = post(
        &tokens,
        "full-access",
        "/quota/consume",
        consume_body("transfer", "u", 1),
    )
    .await;
    assert_eq!(
        full.status,
        StatusCode::OK,
        "a client token acts on every action"
    );
    post(
        &tokens,
        &sms,
        "/quota/consume",
        consume_body("transfer", "u", 1),
    )
    .await
    .assert_problem(403);
    post(
        &tokens,
        "wrong",
        "/quota/consume",
        consume_body("transfer", "u", 1),
    )
    .await
    .assert_problem(401);
    let metrics = tokens.metrics_text().await;
    for reason in ["forbidden", "unknown"] {
        assert!(
            metrics.contains(&format!(
                "quota_auth_failures_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
}

#[tokio::test]
async fn an_expired_key_is_refused_and_listed_as_expired() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms", "sms.send", 10, "day", "UTC"))
        .await;
    let expires_at = crate::helpers::start_instant() + chrono::Duration::hours(1);
    let (key, id) = must_create_key(
        &app,
        json!({"name": "temp", "actions": ["sms.send"], "expires_at": expires_at}),
    )
    .await;
    let ok = post(
        &app,
        &key,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    app.advance(3_600);
    let expired = post(
        &app,
        &key,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    let problem = expired.assert_problem(401);
    assert!(
        problem["detail"].as_str().unwrap_or("").contains("expired"),
        "{problem}"
    );
    let listed = app.admin_get("/admin/keys").await;
    let entry = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == id.as_str())
        .cloned()
        .expect("listed");
    assert_eq!(entry["state"], "expired");
    assert!(app
        .metrics_text()
        .await
        .contains("quota_auth_failures_total{reason=\"expired\"} 1"));
}

#[tokio::test]
async fn a_key_used_is_listed_with_when_it_was_last_used() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms", "sms.send", 10, "day", "UTC"))
        .await;
    let (key, id) = must_create_key(&app, json!({"name": "sms", "actions": ["sms.*"]})).await;
    let listed = app.admin_get("/admin/keys").await;
    assert_eq!(listed.body["items"][0]["last_used_at"], Value::Null);
    post(
        &app,
        &key,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    // Written down every few seconds, off the hot path.
    eventually(
        Duration::from_secs(15),
        "last_used_at is written",
        || async {
            let listed = app.admin_get("/admin/keys").await;
            let key = listed.body["items"][0].clone();
            (key["id"] == id.as_str() && key["last_used_at"].is_string()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn bad_key_input_is_422_naming_the_field_and_creates_nothing() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let past = crate::helpers::start_instant() - chrono::Duration::seconds(1);
    let cases = [
        (
            json!({"name": "x", "actions": ["sms.*"], "operations": ["delete"]}),
            "operations[0]",
        ),
        (
            json!({"name": "x", "actions": ["sms.*"], "operations": []}),
            "operations",
        ),
        (json!({"name": "x", "actions": ["sms..x"]}), "actions[0]"),
        (json!({"name": "x", "actions": ["ok", "SMS"]}), "actions[1]"),
        (json!({"name": "x", "actions": []}), "actions"),
        (
            json!({"name": "x", "actions": ["sms.*"], "expires_at": past}),
            "expires_at",
        ),
        (json!({"name": "", "actions": ["sms.*"]}), "name"),
        (json!({"actions": ["sms.*"]}), "name"),
    ];
    for (body, field) in cases {
        let answer = create_key(&app, body.clone()).await;
        let problem = answer.assert_problem(422);
        assert_eq!(answer.problem_fields(), vec![field], "{body}: {problem}");
    }
    let listed = app.admin_get("/admin/keys").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was created");
    assert_eq!(
        app.consume("x", "u", 1).await.status,
        StatusCode::NOT_FOUND,
        "still open"
    );
    app.send(app.admin(Method::DELETE, "/admin/keys/key_nope"))
        .await
        .assert_problem(404);
}

/// Asserts that `b` refuses `key` within a second of its revocation through `a`.
async fn a_key_revoked_on_one_instance_is_refused_by_another_within_a_second(store: PolicyBackend) {
    let a = spawn_app(store, CounterBackend::Redis).await;
    let b = spawn_with(a.settings.clone()).await;
    a.must_create_policy(calendar_policy("sms", "sms.send", 100, "day", "UTC"))
        .await;
    let (key, id) = must_create_key(&a, json!({"name": "sms", "actions": ["sms.*"]})).await;
    eventually(Duration::from_secs(5), "B accepts the new key", || async {
        let answer = post(&b, &key, "/quota/consume", consume_body("sms.send", "u", 1)).await;
        (answer.status == StatusCode::OK).then_some(())
    })
    .await;
    let revoked = a
        .send(a.admin(Method::DELETE, &format!("/admin/keys/{id}")))
        .await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);
    let started = Instant::now();
    eventually(
        Duration::from_secs(5),
        "B refuses the revoked key",
        || async {
            let answer = post(&b, &key, "/quota/consume", consume_body("sms.send", "u", 1)).await;
            (answer.status == StatusCode::UNAUTHORIZED).then_some(())
        },
    )
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "B refused it after {took:?}");
    let refused = post(&b, &key, "/quota/consume", consume_body("sms.send", "u", 1)).await;
    assert!(refused.assert_problem(401)["detail"]
        .as_str()
        .unwrap_or("")
        .contains("revoked"));
}

/// Every byte of the SQLite database files, as text (lossy).
fn sqlite_bytes(url: &str) -> String {
    let path = url.trim_start_matches("sqlite://");
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::read(format!("{path}{suffix}")).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .collect()
}

async fn the_database_holds_no_key_in_plain_text(store: PolicyBackend) {
    let app = spawn_app(store, CounterBackend::Memory).await;
    let (key, _) = must_create_key(&app, json!({"name": "sms", "actions": ["sms.*"]})).await;
    let secret = &key["qlk_".len()..];
    let stored = match store {
        PolicyBackend::Sqlite => sqlite_bytes(&app.settings.database_url),
        PolicyBackend::Postgres => crate::helpers::pg_dump(&app.settings.database_url),
    };
    assert!(
        stored.contains("api_keys") || stored.contains("sms"),
        "the dump is of the right database"
    );
    let hash = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(key.as_bytes());
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert!(stored.contains(&hash), "the key's SHA-256 is stored");
    assert!(!stored.contains(secret), "the key's secret is not");
    assert!(
        !stored.contains(&secret[8..24]),
        "nor any part past the shown prefix"
    );
}

crate::on_policy_stores!(
    a_key_revoked_on_one_instance_is_refused_by_another_within_a_second,
    the_database_holds_no_key_in_plain_text,
);

/// `quota-ledger keys ARGS` against `app`: exit status, stdout, stderr.
async fn keys_cli(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let args: Vec<&str> = std::iter::once("keys")
        .chain(args.iter().copied())
        .collect();
    crate::helpers::cli(app, &args).await
}

#[tokio::test]
async fn the_cli_creates_lists_and_revokes_keys_through_the_admin_api() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    app.must_create_policy(calendar_policy("sms", "sms.send", 10, "day", "UTC"))
        .await;
    let (code, out, err) = keys_cli(
        &app,
        &[
            "create",
            "--name",
            "sms",
            "--actions",
            "sms.*",
            "--operations",
            "consume,usage",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let key = out.trim().to_owned();
    assert!(key.starts_with("qlk_"), "the key alone on stdout: {out}");
    assert!(err.contains("closed the quota endpoints"), "{err}");
    let allowed = post(
        &app,
        &key,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await;
    assert_eq!(allowed.status, StatusCode::OK);

    let (code, listed, _) = keys_cli(&app, &["list"]).await;
    assert_eq!(code, 0);
    assert!(
        listed.contains("\tactive\t") && listed.contains("actions=sms.*"),
        "{listed}"
    );
    assert!(
        listed.contains("operations=consume,usage") && !listed.contains(&key[4..]),
        "{listed}"
    );
    let id = listed.split('\t').next().unwrap_or("").to_owned();

    let (code, revoked, err) = keys_cli(&app, &["revoke", &id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(revoked.contains("\trevoked\t"), "{revoked}");
    post(
        &app,
        &key,
        "/quota/consume",
        consume_body("sms.send", "u", 1),
    )
    .await
    .assert_problem(401);

    let (code, _, err) = keys_cli(&app, &["create", "--name", "x", "--actions", "sms..x"]).await;
    assert_eq!(code, 1, "a refused create fails");
    assert!(err.contains("422") && err.contains("actions[0]"), "{err}");
}
