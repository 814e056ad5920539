//! A PostgreSQL server of a test's own, which the test can stop and start again.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A PostgreSQL server of the test's own on a free loopback port, for tests that stop and
/// restart it; stopped, and its data deleted, on drop.
///
/// PostgreSQL refuses to run as root: as root, the server runs as the `postgres` system
/// user (created if missing, as scripts/with-stores.sh does) through `runuser`.
pub struct PrivatePostgres {
    ctl: PgCtl,
    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust authentication).
    pub url: String,
}

impl PrivatePostgres {
    /// Creates a cluster with `initdb` in a fresh temp dir, starts it and waits until it is ready.
    pub async fn start() -> Self {
        let postgres = tokio::task::spawn_blocking(Self::init)
            .await
            .expect("initialising the private Postgres");
        postgres.restart().await;
        postgres
    }

    /// [`PrivatePostgres::start`], serving TLS only: `ssl = on` with `cert` and `key` (PEM
    /// files), and `pg_hba.conf` rejecting every connection over TCP without TLS
    /// (`hostnossl … reject`).
    pub async fn start_tls_only(cert: &Path, key: &Path) -> Self {
        let postgres = tokio::task::spawn_blocking(Self::init)
            .await
            .expect("initialising the private Postgres");
        let ctl = &postgres.ctl;
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let target = ctl.data().join(to);
            std::fs::copy(from, &target).expect("copying the server's certificate");
            std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("making the key private");
            if ctl.as_root {
                run(Command::new("chown").arg("postgres:").arg(&target));
            }
        }
        let settings = "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n";
        std::fs::OpenOptions::new()
            .append(true)
            .open(ctl.data().join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, settings.as_bytes()))
            .expect("turning TLS on");
        let hba = "local all all trust\n\
                   hostnossl all all 0.0.0.0/0 reject\n\
                   hostnossl all all ::/0 reject\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostssl all all ::1/128 trust\n";
        std::fs::write(ctl.data().join("pg_hba.conf"), hba).expect("writing pg_hba.conf");
        postgres.restart().await;
        postgres
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|port| port.parse().ok())
            .expect("a port in the URL")
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`), as a crash would.
    pub async fn stop(&self) {
        let ctl = self.ctl.clone();
        tokio::task::spawn_blocking(move || ctl.run("stop"))
            .await
            .expect("stopping the private Postgres");
    }

    /// Starts the server (again) on the same port and data, and waits until it is ready.
    pub async fn restart(&self) {
        let ctl = self.ctl.clone();
        tokio::task::spawn_blocking(move || ctl.run("start"))
            .await
            .expect("starting the private Postgres");
    }

    fn init() -> Self {
        let port = super::free_port();
        let root =
            std::env::temp_dir().join(format!("quota-ledger-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).expect("creating the Postgres temp dir");
        let as_root = run(Command::new("id").arg("-u")).trim() == "0";
        // Owned at once, so that Drop deletes the directory whatever happens next.
        let postgres = Self {
            ctl: PgCtl {
                bin: postgres_bin_dir(),
                root,
                as_root,
            },
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        let ctl = &postgres.ctl;
        if as_root {
            let has_user = Command::new("id").args(["-u", "postgres"]).output();
            if !has_user.is_ok_and(|o| o.status.success()) {
                run(Command::new("useradd").args([
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/usr/sbin/nologin",
                    "postgres",
                ]));
            }
            run(Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&ctl.root));
        }
        run(ctl
            .as_postgres("initdb")
            .arg("-D")
            .arg(ctl.data())
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .args(["-E", "UTF8", "--locale=C"]));
        // `fsync = off` is safe here: `stop -m immediate` kills the server, not the OS, which
        // keeps what was written. `synchronous_commit = off` would not be: the commits still
        // in the server's WAL buffers would be lost, and the test would see old data.
        let settings = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nfull_page_writes = off\n",
            ctl.root.display()
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(ctl.data().join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, settings.as_bytes()))
            .expect("configuring the private Postgres");
        postgres
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.ctl.command("stop").output();
        let _ = std::fs::remove_dir_all(&self.ctl.root);
    }
}

/// Where a private Postgres lives and how to run its tools.
#[derive(Debug, Clone)]
struct PgCtl {
    /// The directory of `initdb` and `pg_ctl`.
    bin: PathBuf,
    /// The temp dir: `data/`, the server log and the Unix socket.
    root: PathBuf,
    /// Whether we are root, so the tools must run as the `postgres` user.
    as_root: bool,
}

impl PgCtl {
    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// `pg_ctl start` or `pg_ctl stop` (immediate), waiting until it is done.
    fn command(&self, action: &str) -> Command {
        let mut command = self.as_postgres("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .args([action, "-w", "-t", "30"]);
        match action {
            "start" => command.arg("-l").arg(self.root.join("postgres.log")),
            _ => command.args(["-m", "immediate"]),
        };
        command
    }

    /// Runs [`Self::command`]; panics with the server log if it fails.
    fn run(&self, action: &str) {
        let output = self.command(action).output().expect("running pg_ctl");
        assert!(
            output.status.success(),
            "pg_ctl {action} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.root.join("postgres.log")).unwrap_or_default()
        );
    }

    /// A command running the Postgres tool `tool`, as the `postgres` user when we are root.
    fn as_postgres(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut command = if self.as_root {
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(program);
            runuser
        } else {
            Command::new(program)
        };
        // The postgres user may not be allowed into the current directory.
        command.current_dir("/");
        command
    }
}

/// Runs a command to completion, panicking with its output unless it succeeds; its stdout.
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`: where the `initdb` on PATH
/// really lives (it is often a symlink), else the newest `/usr/lib/postgresql/*/bin`
/// (where Debian installs them), as scripts/with-stores.sh looks.
fn postgres_bin_dir() -> PathBuf {
    let has_tools = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|t| dir.join(t).is_file())
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = std::env::split_paths(&path)
        .filter_map(|dir| dir.join("initdb").canonicalize().ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
        .find(|dir| has_tools(dir));
    if let Some(dir) = on_path {
        return dir;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_tools(bin))
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .expect("PostgreSQL's initdb and pg_ctl: on PATH or in /usr/lib/postgresql/*/bin")
}

/// The data of the database at `url`, as `pg_dump --data-only` writes it.
pub fn pg_dump(url: &str) -> String {
    run(Command::new(postgres_bin_dir().join("pg_dump"))
        .arg("--data-only")
        .arg(url))
}
