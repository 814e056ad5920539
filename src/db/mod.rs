//! Opening the SQL database that `DATABASE_URL` names (Postgres, or the SQLite default),
//! and its schema: the migrations of every table (policies and the ledger), embedded in
//! the binary so a deployment is one file. `dialect.rs` holds what the stores, each written
//! once for both databases, need to know of the one they run on.

pub(crate) mod appends;
mod dialect;
pub mod formats;
mod migrations;

pub(crate) use dialect::{ColumnType, Dialect, Sql};
pub use formats::FORMATS;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// A connection pool of either kind; the stores pick their implementation from it.
#[derive(Debug, Clone)]
pub enum Pool {
    /// `postgres://…`
    Postgres(sqlx::PgPool),
    /// `sqlite:…`
    Sqlite(sqlx::SqlitePool),
}

/// How long a request waits for a connection before the store counts as down (503).
const ACQUIRE: Duration = Duration::from_secs(3);

/// Opens a pool for `database_url`, with at most `max_postgres` Postgres connections.
///
/// Postgres connects lazily, so the service starts (and reports not-ready) while the
/// database is down; a SQLite file is created on first start.
pub async fn open(database_url: &str, max_postgres: u32) -> anyhow::Result<Pool> {
    open_with(database_url, max_postgres, &[]).await
}

/// [`open`], with `sqlite_pragmas` set on every connection when the database is SQLite.
pub(crate) async fn open_with(
    database_url: &str,
    max_postgres: u32,
    sqlite_pragmas: &[(&'static str, &'static str)],
) -> anyhow::Result<Pool> {
    if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        let pool = PgPoolOptions::new()
            .max_connections(max_postgres)
            .acquire_timeout(ACQUIRE)
            .connect_lazy(database_url)
            .context("parsing DATABASE_URL as a Postgres URL")?;
        Ok(Pool::Postgres(pool))
    } else if database_url.starts_with("sqlite:") {
        let options = SqliteConnectOptions::from_str(database_url)
            .context("parsing DATABASE_URL as a SQLite URL")?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let options = sqlite_pragmas
            .iter()
            .fold(options, |options, &(key, value)| options.pragma(key, value));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            // A SQLite connection is a file handle: nothing to check. The check is a round
            // trip to SQLite's worker thread, a tenth of each embedded ledger commit.
            .test_before_acquire(false)
            .acquire_timeout(ACQUIRE)
            .connect_with(options)
            .await
            .with_context(|| format!("opening the SQLite database {database_url}"))?;
        Ok(Pool::Sqlite(pool))
    } else {
        anyhow::bail!("DATABASE_URL must start with postgres:// or sqlite:")
    }
}

/// The most the first connection to Postgres may take at start.
const FIRST_CONNECTION: Duration = Duration::from_secs(10);

/// Whether `host` names this machine (a plaintext connection there is not worth a warning).
pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.starts_with('/')
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Connects to Postgres once, at start, as libpq's `sslmode` (and `sslrootcert`,
/// `sslcert`, `sslkey`) in `database_url` asks: a certificate that does not verify is an
/// error naming the store and the reason, which stops the start; a connection without TLS
/// to a host other than loopback is logged as a warning. SQLite: nothing to do.
pub async fn check_connection(database_url: &str) -> anyhow::Result<()> {
    if !(database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")) {
        return Ok(());
    }
    let options = sqlx::postgres::PgConnectOptions::from_str(database_url)
        .context("parsing DATABASE_URL as a Postgres URL")?;
    let connecting = <sqlx::PgConnection as sqlx::Connection>::connect_with(&options);
    let mut connection = match tokio::time::timeout(FIRST_CONNECTION, connecting).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(sqlx::Error::Tls(why))) => anyhow::bail!(
            "Postgres (DATABASE_URL): the TLS connection was refused: {why} (sslmode={:?})",
            options.get_ssl_mode()
        ),
        Ok(Err(error)) if crate::tls::refusal(&error).is_some() => anyhow::bail!(
            "Postgres (DATABASE_URL): the TLS connection was refused: {} (sslmode={:?})",
            crate::tls::refusal(&error).unwrap_or_default(),
            options.get_ssl_mode()
        ),
        Ok(Err(error)) => {
            return Err(anyhow::Error::new(error).context("connecting to Postgres (DATABASE_URL)"))
        }
        Err(_) => anyhow::bail!(
            "connecting to Postgres (DATABASE_URL): no answer within {} s",
            FIRST_CONNECTION.as_secs()
        ),
    };
    let encrypted: Option<bool> =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_optional(&mut connection)
            .await
            .context("asking Postgres whether the connection is encrypted")?;
    let host = options.get_host();
    if encrypted != Some(true) && options.get_socket().is_none() && !is_loopback(host) {
        tracing::warn!(host = %host, "Postgres is reached without TLS over the network; set sslmode=verify-full in DATABASE_URL unless the network is private");
    }
    let _ = sqlx::Connection::close(connection).await;
    Ok(())
}

/// Applies the embedded migrations of `pool`'s kind of database (idempotent; forward only).
pub(crate) async fn migrate(pool: &Pool) -> Result<(), sqlx::migrate::MigrateError> {
    match pool {
        Pool::Postgres(pool) => {
            migrations::migrator(migrations::POSTGRES)
                .await?
                .run(pool)
                .await
        }
        Pool::Sqlite(pool) => {
            migrations::migrator(migrations::SQLITE)
                .await?
                .run(pool)
                .await
        }
    }
}

/// Opens `database_url` with one connection, applies the migrations, and closes it.
pub async fn migrate_url(database_url: &str) -> anyhow::Result<()> {
    let pool = open(database_url, 1).await?;
    migrate(&pool)
        .await
        .context("applying the database migrations")?;
    match pool {
        Pool::Postgres(pool) => pool.close().await,
        Pool::Sqlite(pool) => pool.close().await,
    }
    Ok(())
}
