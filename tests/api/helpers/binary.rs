//! The real binary, run as a process of its own.

use super::{calendar_policy, eventually, free_port, ADMIN_TOKEN};
use quota_ledger::config::Settings;
use std::time::Duration;

/// The real binary, run as its own process; killed (SIGKILL) and reaped when dropped.
pub struct Service(Option<std::process::Child>);

impl Service {
    /// Starts `command` (the binary, configured by the caller); killed when dropped.
    pub fn spawn(command: &mut std::process::Command) -> Self {
        Self(Some(command.spawn().expect("starting the binary")))
    }

    /// SIGKILL, as a crash would.
    pub fn kill_9(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, as an orchestrator stopping it would; then waits for it to exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("the process is running");
        let pid = child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("waiting ran")
            .expect("the binary exited")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// Starts the real binary on a free port with `settings`' stores; waits until it answers
/// and returns it with its base URL.
pub async fn start_binary(settings: &Settings, client: &reqwest::Client) -> (Service, String) {
    start_binary_at(env!("CARGO_BIN_EXE_quota-ledger"), settings, client).await
}

/// [`start_binary`] of the binary at `path` (the last release's, in the mixed-version test).
pub async fn start_binary_at(
    path: &str,
    settings: &Settings,
    client: &reqwest::Client,
) -> (Service, String) {
    let port = free_port();
    let service = Service(Some(
        std::process::Command::new(path)
            .env("QUOTA_LISTEN", format!("127.0.0.1:{port}"))
            .env("DATABASE_URL", &settings.database_url)
            .env("REDIS_URL", settings.redis_urls.join(","))
            .env("REDIS_CLUSTER", settings.redis_cluster.to_string())
            .env("QUOTA_REDIS_PREFIX", &settings.redis_prefix)
            .env("QUOTA_REDIS_TIMEOUT_MS", "2000")
            .env("QUOTA_LEDGER_CLAIM_IDLE_MS", "500")
            .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting the binary"),
    ));
    let base = format!("http://127.0.0.1:{port}");
    eventually(
        Duration::from_secs(10),
        "the binary answering /healthz",
        || async {
            let answered = client.get(format!("{base}/healthz")).send().await;
            answered.is_ok().then_some(())
        },
    )
    .await;
    (service, base)
}

/// Creates the binary-level tests' policy `p` (`sms.send`, 1,000,000 a day in UTC) on the
/// service at `base`.
pub async fn create_sms_policy(client: &reqwest::Client, base: &str) {
    let created = client
        .post(format!("{base}/admin/policies"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&calendar_policy("p", "sms.send", 1_000_000, "day", "UTC"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
}
