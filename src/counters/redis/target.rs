//! Where the counters' Redis is and how to reach it: one server, a Redis Cluster, or the
//! primary that Redis Sentinel names; over TLS (`rediss://`) with the certificates the
//! operator gave. Every connection of the store is made here, so a new way to reach
//! Redis changes this file alone.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Client, ConnectionAddr, IntoConnectionInfo, RedisError, TlsCertificates, TlsMode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How often the sentinels are asked which node is the primary: a failover is followed
/// within about this long of the sentinels' `+switch-master` (and at once when Redis
/// refuses a call as a replica).
const SENTINEL_POLL: Duration = Duration::from_millis(500);

/// PEM certificates for TLS to Redis, read and checked once at start.
#[derive(Clone, Default)]
pub struct Certificates {
    /// CA certificates that verify the server; `None`: the system's roots.
    root: Option<Arc<[u8]>>,
    /// A client certificate and its private key.
    client: Option<ClientCertificate>,
}

/// A client certificate (PEM) and its private key (PEM).
type ClientCertificate = (Arc<[u8]>, Arc<[u8]>);

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("root", &self.root.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl Certificates {
    /// Reads the files (`QUOTA_REDIS_CA_FILE`, `QUOTA_REDIS_CERT_FILE`,
    /// `QUOTA_REDIS_KEY_FILE`): a file that cannot be read or holds no PEM certificate
    /// (or key) is an error naming the variable and the file.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let root = ca
            .map(|path| read_certificates("QUOTA_REDIS_CA_FILE", path))
            .transpose()?;
        let client = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let cert = read_certificates("QUOTA_REDIS_CERT_FILE", cert)?;
                let pem = read("QUOTA_REDIS_KEY_FILE", key)?;
                PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    anyhow::anyhow!(
                        "QUOTA_REDIS_KEY_FILE {}: no PEM private key ({e})",
                        key.display()
                    )
                })?;
                Some((cert, pem))
            }
            _ => bail!("QUOTA_REDIS_CERT_FILE and QUOTA_REDIS_KEY_FILE go together"),
        };
        Ok(Self { root, client })
    }

    /// Whether any file was given.
    pub fn given(&self) -> bool {
        self.root.is_some() || self.client.is_some()
    }

    /// The `redis` crate's form.
    fn tls(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.to_vec(),
                    client_key: key.to_vec(),
                }),
            root_cert: self.root.as_ref().map(|root| root.to_vec()),
        }
    }
}

/// The bytes of `path`, the variable named in the error.
fn read(variable: &str, path: &Path) -> anyhow::Result<Arc<[u8]>> {
    std::fs::read(path)
        .map(Arc::from)
        .with_context(|| format!("reading {variable} {}", path.display()))
}

/// The bytes of a PEM file holding at least one certificate.
fn read_certificates(variable: &str, path: &Path) -> anyhow::Result<Arc<[u8]>> {
    let pem = read(variable, path)?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{variable} {}: not PEM ({e})", path.display()))?
        .len();
    if count == 0 {
        bail!("{variable} {}: holds no PEM certificate", path.display());
    }
    Ok(pem)
}

/// The nodes to reach.
#[derive(Debug, Clone)]
enum Nodes {
    /// One server (or a proxy in front of several).
    Standalone(String),
    /// Any nodes of a Redis Cluster; commands are routed by slot.
    Cluster(Vec<String>),
    /// The primary the sentinels name, followed across failovers.
    Sentinel(Arc<Follower>),
}

/// How the store reaches Redis.
#[derive(Debug, Clone)]
pub struct Target {
    /// The nodes.
    nodes: Nodes,
    /// TLS certificates, for `rediss://` URLs.
    certificates: Certificates,
}

impl Target {
    /// One server at `url`.
    pub fn standalone(url: &str) -> anyhow::Result<Self> {
        url.into_connection_info()
            .with_context(|| "REDIS_URL is not a Redis URL".to_owned())?;
        Ok(Self {
            nodes: Nodes::Standalone(url.to_owned()),
            certificates: Certificates::default(),
        })
    }

    /// A Redis Cluster, by any of its nodes.
    pub fn cluster(urls: &[String]) -> anyhow::Result<Self> {
        if urls.is_empty() {
            bail!("a Redis Cluster needs at least one node URL");
        }
        for url in urls {
            url.as_str()
                .into_connection_info()
                .with_context(|| format!("REDIS_URL: '{url}' is not a Redis URL"))?;
        }
        Ok(Self {
            nodes: Nodes::Cluster(urls.to_vec()),
            certificates: Certificates::default(),
        })
    }

    /// The primary that the sentinels at `sentinels` (`host:port`) know as `master`,
    /// reached with the scheme, user, password and database of `template` (a Redis URL
    /// whose host is not used), or plain `redis://` without one.
    pub fn sentinel(
        sentinels: &[String],
        master: &str,
        template: Option<&str>,
    ) -> anyhow::Result<Self> {
        let follower = Follower::new(sentinels, master, template)?;
        Ok(Self {
            nodes: Nodes::Sentinel(Arc::new(follower)),
            certificates: Certificates::default(),
        })
    }

    /// The target, with TLS certificates for `rediss://` URLs.
    pub fn with_certificates(mut self, certificates: Certificates) -> Self {
        self.certificates = certificates;
        self
    }

    /// Redis Cluster mode.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.nodes, Nodes::Cluster(_))
    }

    /// Whether every connection is TLS.
    pub fn is_tls(&self) -> bool {
        match &self.nodes {
            Nodes::Standalone(url) => url.starts_with("rediss://"),
            Nodes::Cluster(urls) => urls.iter().all(|url| url.starts_with("rediss://")),
            Nodes::Sentinel(follower) => follower.tls,
        }
    }

    /// The hosts a connection goes to (for the start's plaintext warning); the sentinels'
    /// for Sentinel.
    pub fn hosts(&self) -> Vec<String> {
        let host = |url: &str| match url.into_connection_info().map(|info| info.addr().clone()) {
            Ok(ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. }) => host,
            _ => String::new(),
        };
        match &self.nodes {
            Nodes::Standalone(url) => vec![host(url)],
            Nodes::Cluster(urls) => urls.iter().map(|url| host(url)).collect(),
            Nodes::Sentinel(follower) => follower
                .sentinels
                .iter()
                .map(|s| s.rsplit_once(':').map_or(s.as_str(), |(h, _)| h).to_owned())
                .collect(),
        }
    }

    /// Counts up each time the primary changes (Sentinel): a connection made under an
    /// older generation is made again.
    pub(super) fn generation(&self) -> u64 {
        match &self.nodes {
            Nodes::Sentinel(follower) => follower.generation.load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// Asks the sentinels again now (a node refused a call as a replica, or went away).
    pub(super) fn suspect_primary(&self) {
        if let Nodes::Sentinel(follower) = &self.nodes {
            follower.ask.notify_one();
        }
    }

    /// Starts following the sentinels in the background (nothing for other targets); the
    /// task ends when the last clone of this target is dropped.
    pub(super) fn follow(&self) {
        if let Nodes::Sentinel(follower) = &self.nodes {
            let weak = Arc::downgrade(follower);
            tokio::spawn(Follower::run(weak));
        }
    }

    /// A client of the one server this target names now, for a standalone connection.
    pub(super) async fn standalone_client(&self) -> Result<Client, RedisError> {
        match &self.nodes {
            Nodes::Standalone(url) if url.starts_with("rediss://") => {
                Client::build_with_tls(url.as_str(), self.certificates.tls())
            }
            Nodes::Standalone(url) => Client::open(url.as_str()),
            Nodes::Sentinel(follower) => follower.primary(&self.certificates).await,
            Nodes::Cluster(_) => Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a Redis Cluster has no standalone client",
            ))),
        }
    }

    /// A cluster client whose calls answer within `response`, connecting within `connect`.
    pub(super) fn cluster_client(
        &self,
        connect: Duration,
        response: Duration,
    ) -> Result<redis::cluster::ClusterClient, RedisError> {
        let Nodes::Cluster(urls) = &self.nodes else {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "not a Redis Cluster",
            )));
        };
        let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
            .connection_timeout(connect)
            .response_timeout(response);
        if self.is_tls() {
            builder = builder.certs(self.certificates.tls());
        }
        builder.build()
    }
}

/// The sentinels, asked for the primary on every new connection and polled in the
/// background: a `ConnectionManager` reconnects to the address it had, which after a
/// failover is a replica (or nothing), so the store remakes its connections when the
/// primary changes.
struct Follower {
    /// `host:port` of each sentinel.
    sentinels: Vec<String>,
    /// The primary's name at the sentinels.
    master: String,
    /// Whether the primary is reached over TLS (a `rediss://` template).
    tls: bool,
    /// The primary's user, password and database.
    node: SentinelNodeConnectionInfo,
    /// The `redis` crate's sentinel client (it keeps connections to the sentinels).
    client: tokio::sync::Mutex<Sentinel>,
    /// The primary's address when last asked.
    primary: Mutex<Option<String>>,
    /// Counts the changes of `primary`.
    generation: AtomicU64,
    /// Wakes the background poll early.
    ask: tokio::sync::Notify,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Follower {
    fn new(sentinels: &[String], master: &str, template: Option<&str>) -> anyhow::Result<Self> {
        let template = template.unwrap_or("redis://127.0.0.1/");
        let info = template
            .into_connection_info()
            .context("REDIS_URL (with REDIS_SENTINELS) is not a Redis URL")?;
        let tls = template.starts_with("rediss://");
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        if tls {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let urls: Vec<String> = sentinels.iter().map(|s| format!("redis://{s}/")).collect();
        let client = Sentinel::build(urls).context("REDIS_SENTINELS")?;
        Ok(Self {
            sentinels: sentinels.to_vec(),
            master: master.to_owned(),
            tls,
            node,
            client: tokio::sync::Mutex::new(client),
            primary: Mutex::new(None),
            generation: AtomicU64::new(0),
            ask: tokio::sync::Notify::new(),
        })
    }

    /// A client of the primary: the sentinels name it, and it answers `ROLE` as a master.
    async fn primary(&self, certificates: &Certificates) -> Result<Client, RedisError> {
        let info = {
            let mut sentinel = self.client.lock().await;
            let client = sentinel
                .async_master_for(&self.master, Some(&self.node))
                .await?;
            client.get_connection_info().clone()
        };
        self.seen(&address(info.addr()));
        match self.tls {
            true => Client::build_with_tls(info, certificates.tls()),
            false => Client::open(info),
        }
    }

    /// Records `address` as the primary; a change starts a new generation.
    fn seen(&self, address: &str) {
        let Ok(mut primary) = self.primary.lock() else {
            return;
        };
        if primary.as_deref() == Some(address) {
            return;
        }
        if let Some(before) = primary.replace(address.to_owned()) {
            tracing::warn!(
                master = %self.master,
                from = %before,
                to = %address,
                "the sentinels name a new Redis primary; reconnecting"
            );
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Polls the sentinels until the follower is dropped.
    async fn run(follower: std::sync::Weak<Self>) {
        loop {
            let Some(this) = follower.upgrade() else {
                return;
            };
            let asked = async {
                let mut sentinel = this.client.lock().await;
                sentinel
                    .async_master_for(&this.master, Some(&this.node))
                    .await
                    .map(|client| address(client.get_connection_info().addr()))
            };
            match tokio::time::timeout(SENTINEL_POLL * 4, asked).await {
                Ok(Ok(address)) => this.seen(&address),
                Ok(Err(error)) => {
                    static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::warn!(count, master = %this.master, error = %error, "the sentinels name no reachable primary");
                    }
                }
                Err(_) => {}
            }
            // Holds the follower for one more poll interval at most.
            let _ = tokio::time::timeout(SENTINEL_POLL, this.ask.notified()).await;
        }
    }
}

/// `host:port` of a connection address.
fn address(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}
