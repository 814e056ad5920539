//! Real faults as a user meets them, on the embedded counters: the disk fills (a small
//! tmpfs), the database turns read-only, another process holds SQLite's write lock,
//! Postgres stops. Each time, usage after recovery equals the allowed answers exactly,
//! the ledger holds one entry per allowed answer, and `counters verify` finds no drift.

use super::refusal::{ledger_rows, WriteLock};
use super::{assert_no_drift, cli_verify};
use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, Answer, CounterBackend, PolicyBackend,
    PrivatePostgres, TestApp,
};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::process::Command;
use tokio::task::JoinSet;

/// A tmpfs of its own, unmounted (lazily) and removed on drop. Mounting needs root, as the
/// service's CI and development machines have.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("quota-ledger-fs-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (the tests run as root)"
        );
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// An app on the embedded counters, on a fresh SQLite file or on `database_url`, with a
/// limit of 10 a day per subject.
async fn sms_app(database_url: Option<String>) -> TestApp {
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    if let Some(url) = database_url {
        settings.database_url = url;
    }
    let app = spawn_with(settings).await;
    app.must_create_policy(calendar_policy("sms", "sms", 10, "day", "UTC"))
        .await;
    app
}

/// Sends `n` consumes over `subjects` subjects, 20 at a time; returns how many were
/// allowed, and asserts every other answer is a denial or the ledger's 503.
async fn flood(app: &TestApp, n: usize, subjects: usize) -> u64 {
    let mut allowed = 0;
    for round in 0..n.div_ceil(20) {
        let mut tasks = JoinSet::new();
        for i in round * 20..n.min(round * 20 + 20) {
            let request = app
                .client
                .post(format!("{}/quota/consume", app.address))
                .json(&json!({"action": "sms", "subject": format!("s{}", i % subjects)}));
            tasks.spawn(async move { Answer::read(request.send().await.unwrap()).await });
        }
        while let Some(answer) = tasks.join_next().await {
            let answer = answer.unwrap();
            match answer.status {
                StatusCode::OK => allowed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                _ => {
                    let problem = answer.assert_problem(503);
                    assert_eq!(
                        problem["type"],
                        "urn:quota-ledger:problem:ledger-unavailable"
                    );
                }
            }
        }
    }
    allowed
}

/// The sum of every subject's usage.
async fn total_usage(app: &TestApp, subjects: usize) -> u64 {
    let mut total = 0;
    for i in 0..subjects {
        let usage = app.usage("sms", &format!("s{i}")).await;
        total += usage.body["policies"][0]["used"].as_u64().unwrap();
    }
    total
}

#[tokio::test]
async fn on_a_full_disk_usage_after_recovery_equals_the_allowed_answers() {
    let fs = Tmpfs::mount("8m");
    let url = format!("sqlite://{}", fs.path().join("quota.db").display());
    let app = sms_app(Some(url)).await;
    let mut allowed = flood(&app, 40, 20).await;
    assert_eq!(allowed, 40);
    // Fill the disk to the last byte.
    let filler = fs.path().join("filler");
    let _ = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", filler.display()))
        .args(["bs=64k", "status=none"])
        .status();
    let during = flood(&app, 400, 50).await;
    assert!(during < 400, "the full disk refused some: {during} allowed");
    allowed += during;
    std::fs::remove_file(&filler).unwrap();
    allowed += flood(&app, 100, 50).await;
    assert_eq!(
        total_usage(&app, 50).await,
        allowed,
        "usage equals the allowed answers"
    );
    assert_no_drift(&app).await;
    let url = app.settings.database_url.clone();
    let app = app.restart().await;
    assert_eq!(
        total_usage(&app, 50).await,
        allowed,
        "and so after a restart"
    );
    assert_eq!(ledger_rows(&url).await, i64::try_from(allowed).unwrap());
    assert_eq!(cli_verify(&app).await.0, 0);
    drop(app);
}

#[tokio::test]
async fn while_the_database_is_read_only_nothing_is_charged_until_it_is_writable_again() {
    let postgres = PrivatePostgres::start().await;
    let app = sms_app(Some(postgres.url.clone())).await;
    let mut allowed = flood(&app, 20, 10).await;
    read_only(&postgres.url, true).await;
    assert_eq!(flood(&app, 60, 10).await, 0, "nothing can be recorded");
    assert_eq!(total_usage(&app, 10).await, allowed);
    read_only(&postgres.url, false).await;
    allowed += flood(&app, 40, 10).await;
    assert_eq!(total_usage(&app, 10).await, allowed);
    assert_no_drift(&app).await;
    let app = app.crash_restart().await;
    assert_eq!(total_usage(&app, 10).await, allowed);
}

/// Makes every transaction of the Postgres at `url` read-only (or writable again), for
/// the sessions open already too, as a standby or a read-only switch would.
async fn read_only(url: &str, on: bool) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let value = if on { "on" } else { "off" };
    sqlx::query(&format!(
        "ALTER SYSTEM SET default_transaction_read_only = {value}"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();
    // A reload reaches each session at its next command.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
}

#[tokio::test]
async fn while_another_process_holds_sqlites_write_lock_consumes_are_refused_and_leave_nothing() {
    let app = sms_app(None).await;
    let mut allowed = flood(&app, 10, 5).await;
    let lock = WriteLock::take(&app.settings.database_url).await;
    // Each waits for SQLite's busy timeout (5 s), then is refused.
    assert_eq!(flood(&app, 20, 5).await, 0);
    lock.release().await;
    assert_eq!(total_usage(&app, 5).await, allowed);
    allowed += flood(&app, 20, 5).await;
    assert_eq!(total_usage(&app, 5).await, allowed);
    assert_no_drift(&app).await;
}

#[tokio::test]
async fn with_postgres_stopped_consumes_are_refused_and_usage_follows_the_ledger() {
    let postgres = PrivatePostgres::start().await;
    let app = sms_app(Some(postgres.url.clone())).await;
    let mut allowed = flood(&app, 10, 5).await;
    postgres.stop().await;
    assert_eq!(flood(&app, 20, 5).await, 0);
    assert_eq!(total_usage(&app, 5).await, allowed);
    postgres.restart().await;
    allowed += flood(&app, 20, 5).await;
    assert_eq!(total_usage(&app, 5).await, allowed);
    assert_no_drift(&app).await;
    let app = app.crash_restart().await;
    assert_eq!(total_usage(&app, 5).await, allowed);
    assert_eq!(
        ledger_rows(&postgres.url).await,
        i64::try_from(allowed).unwrap()
    );
}
