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
        let mut args = vec!["--port".to_owned(), port.to_string()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::spawn(port, format!("redis://127.0.0.1:{port}/"), &args).await
    }

    /// A Redis serving TLS only, on a free port, with the server's `cert` and `key` and
    /// client certificates verified against `ca` (required when `client_certs`); its URL
    /// is `rediss://localhost:PORT/`. With `cluster`, a one-node Redis Cluster over TLS.
    pub async fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
        client_certs: bool,
        cluster: bool,
    ) -> Self {
        let port = free_port();
        let path = |p: &std::path::Path| p.display().to_string();
        let mut args: Vec<String> = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &path(cert),
            "--tls-key-file",
            &path(key),
            "--tls-ca-cert-file",
            &path(ca),
            "--tls-auth-clients",
            if client_certs { "yes" } else { "no" },
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        if cluster {
            let nodes = std::env::temp_dir().join(format!("quota-ledger-nodes-{port}.conf"));
            // A server once on this port may have left its slots there: start afresh.
            let _ = std::fs::remove_file(&nodes);
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--tls-cluster",
                    "yes",
                    "--cluster-config-file",
                    &nodes.display().to_string(),
                ]
                .iter()
                .map(|a| (*a).to_owned()),
            );
        }
        Self::spawn(port, format!("rediss://localhost:{port}/"), &args).await
    }

    /// A Redis Sentinel on a free port, watching the primary on `primary_port` as `name`
    /// (a quorum of 2, down after 1 s).
    pub async fn start_sentinel(name: &str, primary_port: u16) -> Self {
        let port = free_port();
        let config = std::env::temp_dir().join(format!("quota-ledger-sentinel-{port}.conf"));
        let text = format!(
            "port {port}\nbind 127.0.0.1\nsentinel monitor {name} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 10000\nsentinel parallel-syncs {name} 1\n"
        );
        std::fs::write(&config, text).expect("writing the sentinel's config");
        let args = [config.display().to_string(), "--sentinel".to_owned()];
        Self::spawn(port, format!("redis://127.0.0.1:{port}/"), &args).await
    }

    /// Runs `redis-server` without persistence with `args`, and waits until `port` accepts.
    async fn spawn(port: u16, url: String, args: &[String]) -> Self {
        Self::spawn_skewed(port, url, args, None).await
    }

    /// [`Self::spawn`], its wall clock moved by `skew_s` seconds when given
    /// (`clock_shift.c`, preloaded).
    async fn spawn_skewed(port: u16, url: String, args: &[String], skew_s: Option<i64>) -> Self {
        // A directory of its own: a replica's full sync writes an RDB file there, which a
        // server started later in the same directory would load.
        let dir = std::env::temp_dir().join(format!("quota-ledger-redis-{port}"));
        std::fs::create_dir_all(&dir).expect("creating the Redis dir");
        let mut command = std::process::Command::new("redis-server");
        if let Some(skew_s) = skew_s {
            command
                .env("LD_PRELOAD", clock_shift())
                .env("CLOCK_SHIFT_S", skew_s.to_string());
        }
        command.current_dir(&dir);
        // A sentinel's config file comes first, and a sentinel takes no persistence options.
        match args.iter().any(|a| a == "--sentinel") {
            true => command.args(args),
            false => command
                .args([
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                ])
                .arg(&dir)
                .args(args),
        };
        let child = command
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting redis-server (scripts/test.sh installs it)");
        // Owned at once, so that Drop stops the server whatever happens next.
        let redis = Self { child, port, url };
        let what = format!("redis-server accepting connections on port {port}");
        eventually(Duration::from_secs(5), &what, || async {
            let connected = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
            connected.is_ok().then_some(())
        })
        .await;
        redis
    }

    /// Runs `redis-cli` with `args` against this server (over TLS with `tls`: the CA, the
    /// client certificate and its key).
    pub fn cli(&self, tls: Option<[&std::path::Path; 3]>, args: &[&str]) -> String {
        let mut command = std::process::Command::new("redis-cli");
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some([ca, cert, key]) = tls {
            command
                .arg("--tls")
                .arg("--cacert")
                .arg(ca)
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key)
                .args(["--sni", "localhost"]);
        }
        let output = command.args(args).output().expect("running redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A Redis Cluster of the test's own, one primary per entry of `skews` (its wall clock
    /// moved by that many seconds when given), the slots split evenly between them in order.
    pub async fn start_cluster_of(skews: &[Option<i64>]) -> Vec<Self> {
        let mut nodes = Vec::new();
        for skew in skews {
            let port = free_port();
            let config = std::env::temp_dir().join(format!("quota-ledger-nodes-{port}.conf"));
            let _ = std::fs::remove_file(&config);
            let args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &config.to_string_lossy(),
            ]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
            let url = format!("redis://127.0.0.1:{port}/");
            nodes.push(Self::spawn_skewed(port, url, &args, *skew).await);
        }
        let share = 16_384 / nodes.len();
        for (i, node) in nodes.iter().enumerate() {
            let first = i * share;
            let last = if i + 1 == nodes.len() {
                16_383
            } else {
                first + share - 1
            };
            let added = node.cli(
                None,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            );
            assert!(added.contains("OK"), "CLUSTER ADDSLOTSRANGE: {added}");
            if i > 0 {
                let port = nodes[0].port().to_string();
                let met = node.cli(None, &["CLUSTER", "MEET", "127.0.0.1", &port]);
                assert!(met.contains("OK"), "CLUSTER MEET: {met}");
            }
        }
        for node in &nodes {
            eventually(Duration::from_secs(20), "the cluster is up", || async {
                let info = node.cli(None, &["CLUSTER", "INFO"]);
                let known = format!("cluster_known_nodes:{}", skews.len());
                (info.contains("cluster_state:ok") && info.contains(&known)).then_some(())
            })
            .await;
        }
        nodes
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

    /// A replica of `primary`, a one-node cluster of [`PrivateRedis::start_cluster`]: a
    /// cluster node of its own that meets the primary and replicates it, once online.
    pub async fn start_cluster_replica(primary: &PrivateRedis) -> Self {
        let port = free_port();
        let nodes = std::env::temp_dir().join(format!("quota-ledger-nodes-{port}.conf"));
        let _ = std::fs::remove_file(&nodes);
        let nodes = nodes.to_string_lossy().into_owned();
        let replica = Self::start_with(
            port,
            &["--cluster-enabled", "yes", "--cluster-config-file", &nodes],
        )
        .await;
        let primary_id = primary.cli(None, &["CLUSTER", "MYID"]).trim().to_owned();
        let met = replica.cli(
            None,
            &["CLUSTER", "MEET", "127.0.0.1", &primary.port().to_string()],
        );
        assert!(met.contains("OK"), "CLUSTER MEET: {met}");
        eventually(
            Duration::from_secs(10),
            "the replica knows the primary",
            || async {
                let known = replica.cli(None, &["CLUSTER", "NODES"]);
                known.contains(&primary_id).then_some(())
            },
        )
        .await;
        eventually(
            Duration::from_secs(10),
            "the replica replicates the primary",
            || async {
                let answer = replica.cli(None, &["CLUSTER", "REPLICATE", &primary_id]);
                answer.contains("OK").then_some(())
            },
        )
        .await;
        eventually(
            Duration::from_secs(20),
            "the cluster replica is online",
            || async {
                let info = primary.cli(None, &["INFO", "replication"]);
                info.contains("state=online").then_some(())
            },
        )
        .await;
        let _ = std::fs::remove_file(&nodes);
        replica
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        let dir = std::env::temp_dir().join(format!("quota-ledger-redis-{}", self.port));
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The clock shift library (`clock_shift.c`), compiled once per test run.
fn clock_shift() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/api/helpers/clock_shift.c"
            );
            let library = std::env::temp_dir().join(format!(
                "quota-ledger-clock-shift-{}.so",
                std::process::id()
            ));
            let built = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&library)
                .arg(source)
                .status()
                .expect("running cc");
            assert!(built.success(), "compiling {source}");
            library
        })
        .clone()
}
