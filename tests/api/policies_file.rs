//! Policies as code: `quota-ledger policies export | diff | apply`, run as the binary
//! against a real running service.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend, TestApp, ADMIN_TOKEN};
use quota_ledger::cli::policies::{self, Remote};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Output;

/// `quota-ledger policies ARGS` against `app`.
async fn policies_cli(app: &TestApp, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"));
    command
        .arg("policies")
        .args(args)
        .env("QUOTA_URL", &app.address)
        .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN);
    run(command).await
}

/// Runs `command` off the test's runtime (which serves the app meanwhile).
async fn run(mut command: std::process::Command) -> Output {
    command
        .env("DATABASE_URL", "sqlite::memory:")
        .env_remove("REDIS_URL");
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("running the binary")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("an exit code")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A file in a fresh temporary directory (kept by the caller's `TempDir` value).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("ql-policies-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The service's policies without server-set fields, by id.
async fn listed(app: &TestApp) -> Vec<Value> {
    let list = app.admin_get("/admin/policies").await;
    list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut p = p.clone();
            for field in ["created_at", "updated_at", "version"] {
                p.as_object_mut().unwrap().remove(field);
            }
            p
        })
        .collect()
}

/// The example policy file the README points to.
const FILE: &str = include_str!("../../examples/policies.yaml");

#[tokio::test]
async fn apply_creates_then_changes_nothing_and_diff_exits_by_what_would_change() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let dir = TempDir::new();
    let file = dir.write("policies.yaml", FILE);

    let diff = policies_cli(&app, &["diff", arg(&file)]).await;
    assert_eq!(code(&diff), 2, "{}", text(&diff));
    assert!(
        text(&diff).contains("+ sms-per-day: create"),
        "{}",
        text(&diff)
    );
    assert!(listed(&app).await.is_empty(), "diff changes nothing");

    let dry = policies_cli(&app, &["apply", "--dry-run", arg(&file)]).await;
    assert_eq!(code(&dry), 0, "{}", text(&dry));
    assert!(listed(&app).await.is_empty(), "a dry run changes nothing");

    let apply = policies_cli(&app, &["apply", arg(&file)]).await;
    assert_eq!(code(&apply), 0, "{}", text(&apply));
    let now = listed(&app).await;
    assert_eq!(now.len(), 2);
    assert_eq!(now[0]["id"], "sms-per-day");
    assert_eq!(now[0]["window"]["timezone"], "America/New_York");
    assert_eq!(
        now[1]["description"],
        "At most $2,000.00 in any rolling 24 hours"
    );
    let versions = app.admin_get("/admin/policies/sms-per-day").await.body["version"].clone();

    let again = policies_cli(&app, &["apply", arg(&file)]).await;
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert!(text(&again).contains("0 to create, 0 to update, 0 to delete"));
    assert_eq!(
        app.admin_get("/admin/policies/sms-per-day").await.body["version"],
        versions,
        "a second apply writes nothing"
    );
    let diff = policies_cli(&app, &["diff", arg(&file)]).await;
    assert_eq!(code(&diff), 0, "{}", text(&diff));

    // An edit: the diff names the field, the apply makes it, usage is kept.
    assert_eq!(app.consume("sms", "u", 1).await.status, StatusCode::OK);
    let edited = dir.write("policies.yaml", &FILE.replace("limit: 10", "limit: 20"));
    let diff = policies_cli(&app, &["diff", arg(&edited)]).await;
    assert_eq!(code(&diff), 2);
    assert!(
        text(&diff).contains("~ sms-per-day: update\n    limit: 10 -> 20"),
        "{}",
        text(&diff)
    );
    let apply = policies_cli(&app, &["apply", arg(&edited)]).await;
    assert_eq!(code(&apply), 0, "{}", text(&apply));
    let usage = app.usage("sms", "u").await;
    assert_eq!(usage.body["policies"][0]["limit"], 20);
    assert_eq!(
        usage.body["policies"][0]["used"], 1,
        "a new limit keeps usage"
    );
}

#[tokio::test]
async fn export_round_trips_through_apply_in_yaml_and_json() {
    let source = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let dir = TempDir::new();
    let file = dir.write("policies.yaml", FILE);
    assert_eq!(
        code(&policies_cli(&source, &["apply", arg(&file)]).await),
        0
    );
    for (format, name) in [(None, "export.yaml"), (Some("--json"), "export.json")] {
        let mut args = vec!["export"];
        args.extend(format);
        let export = policies_cli(&source, &args).await;
        assert_eq!(code(&export), 0, "{}", text(&export));
        let exported = dir.write(name, &String::from_utf8(export.stdout).unwrap());
        let target = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
        let apply = policies_cli(&target, &["apply", arg(&exported)]).await;
        assert_eq!(code(&apply), 0, "{}", text(&apply));
        assert_eq!(listed(&target).await, listed(&source).await, "{name}");
        let diff = policies_cli(&source, &["diff", arg(&exported)]).await;
        assert_eq!(
            code(&diff),
            0,
            "the export matches its source: {}",
            text(&diff)
        );
    }
}

#[tokio::test]
async fn an_invalid_file_changes_nothing_and_names_each_entry_and_field() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let dir = TempDir::new();
    let file = dir.write(
        "policies.yaml",
        &format!(
            "{FILE}  - {{id: bad, action: a, measure: count, limit: -5, window: {{type: calendar, period: day}}}}\n\
             \x20 - {{id: zone, action: a, measure: count, limit: 1, window: {{type: calendar, period: day, timezone: Mars/Base}}}}\n"
        ),
    );
    let apply = policies_cli(&app, &["apply", arg(&file)]).await;
    assert_eq!(code(&apply), 1, "{}", text(&apply));
    let out = text(&apply);
    assert!(out.contains("policies[2] (id bad): field `limit`"), "{out}");
    assert!(
        out.contains("policies[3] (id zone): field `window.timezone`"),
        "{out}"
    );
    assert!(out.contains("nothing was changed"), "{out}");
    assert!(
        listed(&app).await.is_empty(),
        "the valid entries were not applied either"
    );
}

#[tokio::test]
async fn prune_deletes_what_the_file_omits_and_only_with_prune() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let dir = TempDir::new();
    let file = dir.write("policies.yaml", FILE);
    assert_eq!(code(&policies_cli(&app, &["apply", arg(&file)]).await), 0);
    let smaller = dir.write(
        "smaller.yaml",
        FILE.split("  - id: transfer-usd-24h").next().unwrap(),
    );
    let apply = policies_cli(&app, &["apply", arg(&smaller)]).await;
    assert_eq!(code(&apply), 0);
    assert!(
        text(&apply).contains("kept, not in the file"),
        "{}",
        text(&apply)
    );
    assert_eq!(listed(&app).await.len(), 2, "kept without --prune");
    let diff = policies_cli(&app, &["diff", "--prune", arg(&smaller)]).await;
    assert_eq!(code(&diff), 2);
    assert!(text(&diff).contains("- transfer-usd-24h: delete"));
    let prune = policies_cli(&app, &["apply", "--prune", arg(&smaller)]).await;
    assert_eq!(code(&prune), 0, "{}", text(&prune));
    assert_eq!(listed(&app).await.len(), 1);
}

/// A policy edited by someone else between the plan and the apply is not overwritten: the
/// write is conditional on the version the plan saw, and the command reports a conflict.
#[tokio::test]
async fn a_concurrent_edit_is_a_conflict_never_clobbered() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let dir = TempDir::new();
    let file = dir.write("policies.yaml", FILE);
    assert_eq!(code(&policies_cli(&app, &["apply", arg(&file)]).await), 0);

    let remote = Remote::new(&app.address, ADMIN_TOKEN).unwrap();
    let desired = policies::read_file(&FILE.replace("limit: 10", "limit: 30")).unwrap();
    let plan = policies::plan(&remote, &desired, false).await.unwrap();
    assert_eq!(plan.changes.len(), 1);
    // Someone else edits the policy meanwhile.
    let mut theirs = app.admin_get("/admin/policies/sms-per-day").await.body;
    theirs["limit"] = json!(15);
    for field in ["created_at", "updated_at", "version"] {
        theirs.as_object_mut().unwrap().remove(field);
    }
    let put = app
        .send(
            app.admin(Method::PUT, "/admin/policies/sms-per-day")
                .json(&theirs),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);

    let applied = policies::execute(&remote, &plan).await.unwrap();
    let conflict = applied.conflict.expect("a conflict");
    assert!(
        conflict.contains("sms-per-day") && conflict.contains("412"),
        "{conflict}"
    );
    assert_eq!(
        app.admin_get("/admin/policies/sms-per-day").await.body["limit"],
        15,
        "their edit stands"
    );
    // From the command line: a policy created meanwhile is a conflict too (exit 3).
    let racing = dir.write(
        "racing.yaml",
        &format!("{FILE}  - {{id: new-one, action: a, measure: count, limit: 1, window: {{type: calendar, period: day}}}}\n"),
    );
    let desired = policies::read_file(&std::fs::read_to_string(&racing).unwrap()).unwrap();
    let plan = policies::plan(&remote, &desired, false).await.unwrap();
    let created = app
        .send(app.admin(Method::POST, "/admin/policies").json(&json!({
            "id": "new-one", "action": "b", "measure": "count", "limit": 2,
            "window": {"type": "calendar", "period": "day"}})))
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let applied = policies::execute(&remote, &plan).await.unwrap();
    assert!(applied.conflict.is_some_and(|c| c.contains("new-one")));
    assert_eq!(
        app.admin_get("/admin/policies/new-one").await.body["action"],
        "b"
    );
}

#[tokio::test]
async fn a_wrong_token_or_an_unreachable_service_fails_with_exit_1() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"));
    command
        .args(["policies", "export"])
        .env("QUOTA_URL", &app.address)
        .env("QUOTA_ADMIN_TOKEN", "wrong");
    let output = run(command).await;
    assert_eq!(code(&output), 1);
    assert!(text(&output).contains("401"), "{}", text(&output));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"));
    command
        .args(["policies", "export", "--url", "http://127.0.0.1:9"])
        .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN);
    let output = run(command).await;
    assert_eq!(code(&output), 1);
    assert!(
        text(&output).contains("reaching http://127.0.0.1:9"),
        "{}",
        text(&output)
    );
}

/// An app that keeps its ledger for ever (lifetime windows need it).
async fn kept_for_ever() -> TestApp {
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.ledger_retention_days = None;
    crate::helpers::spawn_with(settings).await
}

#[tokio::test]
async fn velocity_controls_round_trip_through_export_and_apply() {
    let source = kept_for_ever().await;
    let policies = [
        json!({"id": "cut-off", "action": "card.auth", "measure": "amount", "limit": 200_000,
            "window": {"type": "calendar", "period": "day", "timezone": "America/New_York",
                "day_start": "04:00", "timezone_attribute": "tz"}}),
        json!({"id": "fiscal", "action": "card.auth", "measure": "amount", "limit": 9_000_000,
            "window": {"type": "calendar", "period": "year", "timezone": "Europe/London",
                "month_day": 6, "year_month": 4}}),
        json!({"id": "weekly", "action": "card.auth", "measure": "count", "limit": 50,
            "window": {"type": "calendar", "period": "week", "week_start": "sunday"}}),
        json!({"id": "per-auth", "action": "card.auth", "measure": "amount", "limit": 50_000,
            "window": {"type": "request"}}),
        json!({"id": "lifetime", "action": "card.auth", "measure": "amount", "limit": 2_500_000,
            "match": {"card_type": ["prepaid"]}, "window": {"type": "lifetime"}}),
        json!({"id": "cash-abroad", "action": "card.auth", "measure": "amount", "limit": 0,
            "match": {"mcc": ["6011"]}, "match_not": {"country": ["US", "CA"]},
            "window": {"type": "request"}}),
    ];
    for policy in policies {
        source.must_create_policy(policy).await;
    }
    let dir = TempDir::new();
    let export = policies_cli(&source, &["export"]).await;
    assert_eq!(code(&export), 0, "{}", text(&export));
    let exported = dir.write("export.yaml", &String::from_utf8(export.stdout).unwrap());
    let target = kept_for_ever().await;
    let apply = policies_cli(&target, &["apply", arg(&exported)]).await;
    assert_eq!(code(&apply), 0, "{}", text(&apply));
    assert_eq!(listed(&target).await, listed(&source).await);
    let diff = policies_cli(&target, &["diff", arg(&exported)]).await;
    assert_eq!(code(&diff), 0, "nothing left to change: {}", text(&diff));
}
