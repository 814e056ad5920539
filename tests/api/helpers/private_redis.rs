//! A Redis server (or one-node cluster) of a test's own.

use super::{eventually, free_port};
use std::time::Duration;

/// A Redis server of the test's own on a free loopback port, stopped on drop; for tests
/// that need server-wide statistics or to stop and restart Redis.
pub struct PrivateRedis {
    child: std::process::Child,
    port: u16,
    /// `redis://127.0.0.1:PORT/`.
    pub url: String,
}

impl PrivateRedis {
    /// Starts `redis-server` without persistence on a free port and waits until it answers.
    pub async fn start() -> Self {
        Self::start_on(free_port()).await
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts `redis-server` without persistence on `port` and waits until it answers.
    pub async fn start_on(port: u16) -> Self {
        Self::start_with(port, &[]).await
    }

    /// [`PrivateRedis::start_on`], with `extra` server options (e.g. a maxmemory-policy).
    pub async fn start_with(port: u16, extra: &[&str]) -> Self {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting redis-server (scripts/test.sh installs it)");
        // Owned at once, so that Drop stops the server whatever happens next.
        let redis = Self {
            child,
            port,
            url: format!("redis://127.0.0.1:{port}/"),
        };
        let what = format!("redis-server accepting connections on port {port}");
        eventually(Duration::from_secs(5), &what, || async {
            let connected = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
            connected.is_ok().then_some(())
        })
        .await;
        redis
    }

    /// A one-node Redis Cluster of the test's own (every slot on one primary), so that a test
    /// can freeze a cluster without touching the shared one.
    pub async fn start_cluster() -> Self {
        let port = free_port();
        let nodes = std::env::temp_dir().join(format!("quota-ledger-nodes-{port}.conf"));
        let nodes = nodes.to_string_lossy().into_owned();
        let redis = Self::start_with(
            port,
            &["--cluster-enabled", "yes", "--cluster-config-file", &nodes],
        )
        .await;
        let cli = |args: &[&str]| {
            std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string()])
                .args(args)
                .output()
                .expect("running redis-cli")
        };
        let added = cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        assert!(added.status.success(), "{added:?}");
        eventually(
            Duration::from_secs(10),
            "the one-node cluster is up",
            || async {
                let info = String::from_utf8_lossy(&cli(&["CLUSTER", "INFO"]).stdout).into_owned();
                info.contains("cluster_state:ok").then_some(())
            },
        )
        .await;
        let _ = std::fs::remove_file(&nodes);
        redis
    }

    /// Freezes the server (SIGSTOP): it accepts connections but answers nothing, like a hung Redis.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Unfreezes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// A connection for inspecting the server.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("valid URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connecting to the private Redis")
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
