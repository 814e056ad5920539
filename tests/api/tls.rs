//! TLS to Redis (standalone and cluster, with a client certificate) and to Postgres (libpq's
//! `sslmode`), on servers of the tests' own that refuse plaintext, with certificates the
//! tests make; a certificate that does not verify stops the real binary's start (exit 1).

use crate::helpers::{
    calendar_policy, fresh_settings, spawn_with, CounterBackend, PolicyBackend, PrivatePostgres,
    PrivateRedis, TestCerts,
};
use crate::integrity::verify;
use std::time::{Duration, Instant};

/// A day budget of 2 for `tls.send`, consumed three times: 200, 200, 429.
async fn two_then_denied(app: &crate::helpers::TestApp) {
    app.must_create_policy(calendar_policy("tls-daily", "tls.send", 2, "day", "UTC"))
        .await;
    let statuses: Vec<u16> = three_consumes(app).await;
    assert_eq!(statuses, [200, 200, 429], "a limit of 2, counted over TLS");
    let verified = verify(app).await;
    assert_eq!(verified["drift"], serde_json::json!([]), "{verified}");
}

async fn three_consumes(app: &crate::helpers::TestApp) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(app.consume("tls.send", "u-1", 1).await.status.as_u16());
    }
    statuses
}

#[tokio::test]
async fn redis_over_tls_with_a_ca_file_and_a_client_certificate_counts_as_plain_redis() {
    let certs = TestCerts::make();
    let (cert, key) = certs.server();
    let redis = PrivateRedis::start_tls(&cert, &key, &certs.ca(), true, false).await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    let (client_cert, client_key) = certs.client();
    settings.redis_tls.ca_file = Some(certs.ca());
    settings.redis_tls.cert_file = Some(client_cert.clone());
    settings.redis_tls.key_file = Some(client_key.clone());
    let app = spawn_with(settings).await;
    two_then_denied(&app).await;
    // The counters are in this Redis, reached over TLS (it has no plaintext port).
    let keys = redis.cli(Some([&certs.ca(), &client_cert, &client_key]), &["DBSIZE"]);
    assert!(
        keys.trim().parse::<u64>().unwrap() > 0,
        "keys in the TLS Redis: {keys}"
    );
}

#[tokio::test]
async fn a_rediss_cluster_counts_as_the_plain_one_does() {
    let certs = TestCerts::make();
    let (cert, key) = certs.server();
    let redis = PrivateRedis::start_tls(&cert, &key, &certs.ca(), false, true).await;
    let tls = Some([certs.ca(), certs.client().0, certs.client().1]);
    let paths = tls
        .as_ref()
        .map(|[a, b, c]| [a.as_path(), b.as_path(), c.as_path()]);
    let added = redis.cli(paths, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    assert!(added.contains("OK"), "{added}");
    crate::helpers::eventually(Duration::from_secs(10), "the TLS cluster is up", || async {
        redis
            .cli(paths, &["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
            .then_some(())
    })
    .await;
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.redis_urls = vec![redis.url.clone()];
    settings.redis_cluster = true;
    settings.redis_tls.ca_file = Some(certs.ca());
    let app = spawn_with(settings).await;
    two_then_denied(&app).await;
}

#[tokio::test]
async fn postgres_verify_full_connects_and_a_plaintext_connection_is_refused() {
    let certs = TestCerts::make();
    let (cert, key) = certs.server();
    let postgres = PrivatePostgres::start_tls_only(&cert, &key).await;
    let port = postgres.port();
    let ca = certs.ca().display().to_string();
    let mut settings = fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.database_url = format!(
        "postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    let app = spawn_with(settings).await;
    two_then_denied(&app).await;
    let ledger = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?action=tls.send", app.address)),
        )
        .await;
    assert_eq!(
        ledger.body["items"].as_array().unwrap().len(),
        2,
        "{}",
        ledger.body
    );

    // The server refuses plaintext: sslmode=disable cannot start a service on it.
    let plain = format!("postgres://postgres@localhost:{port}/postgres?sslmode=disable");
    let error = app.restart_refused(|s| s.database_url = plain).await;
    assert!(
        error.contains("Postgres") && error.contains("no encryption"),
        "{error}"
    );
}

/// Runs the real binary with `env` until it exits (at most 30 s): its exit code and stderr.
fn start_refused(env: &[(&str, String)]) -> (i32, String) {
    let dir = tempdir();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quota-ledger"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUOTA_LISTEN", "127.0.0.1:0")
        .env("QUOTA_ADMIN_TOKEN", crate::helpers::ADMIN_TOKEN)
        .env(
            "DATABASE_URL",
            format!("sqlite://{}/ledger.db", dir.display()),
        )
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("starting the binary");
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("waiting for the binary") {
            break status.code().unwrap_or(-1);
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the binary started although its store's certificate does not verify");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (code, stderr)
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "quota-ledger-tls-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_redis_certificate_that_does_not_verify_stops_the_start_naming_redis() {
    let certs = TestCerts::make();
    let (cert, key) = certs.server();
    let redis = PrivateRedis::start_tls(&cert, &key, &certs.ca(), false, false).await;
    let port = redis.port();
    let cases = [
        (
            "another CA",
            format!("rediss://localhost:{port}/"),
            certs.other_ca(),
            "invalid peer certificate",
        ),
        (
            "another host name",
            format!("rediss://127.0.0.1:{port}/"),
            certs.ca(),
            "invalid peer certificate",
        ),
    ];
    for (case, url, ca, reason) in cases {
        let env = [
            ("REDIS_URL", url),
            ("QUOTA_REDIS_CA_FILE", ca.display().to_string()),
        ];
        let (code, stderr) = tokio::task::spawn_blocking(move || start_refused(&env))
            .await
            .unwrap();
        assert_eq!(code, 1, "{case}: {stderr}");
        assert!(
            stderr.contains("Redis") && stderr.contains(reason),
            "{case}: {stderr}"
        );
    }
    // An unreadable CA file stops the start too, naming the variable.
    let env = [
        ("REDIS_URL", format!("rediss://localhost:{port}/")),
        ("QUOTA_REDIS_CA_FILE", "/nonexistent/ca.pem".to_owned()),
    ];
    let (code, stderr) = tokio::task::spawn_blocking(move || start_refused(&env))
        .await
        .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("QUOTA_REDIS_CA_FILE"), "{stderr}");
}

#[tokio::test]
async fn a_postgres_certificate_that_does_not_verify_stops_the_start_naming_postgres() {
    let certs = TestCerts::make();
    let (cert, key) = certs.server();
    let postgres = PrivatePostgres::start_tls_only(&cert, &key).await;
    let port = postgres.port();
    let url = |host: &str, ca: &std::path::Path| {
        format!(
            "postgres://postgres@{host}:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            ca.display()
        )
    };
    let cases = [
        ("another CA", url("localhost", &certs.other_ca())),
        ("another host name", url("127.0.0.1", &certs.ca())),
    ];
    for (case, database_url) in cases {
        let env = [("DATABASE_URL", database_url)];
        let (code, stderr) = tokio::task::spawn_blocking(move || start_refused(&env))
            .await
            .unwrap();
        assert_eq!(code, 1, "{case}: {stderr}");
        assert!(
            stderr.contains("Postgres (DATABASE_URL): the TLS connection was refused"),
            "{case}: {stderr}"
        );
    }
}
