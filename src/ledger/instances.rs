//! Instances announce themselves: every running instance upserts a row of
//! `service_instances` (a random id, its version, the newest version of the persisted
//! formats it reads, when it started, when it was last seen) every [`ANNOUNCE_EVERY`],
//! in the ledger's database, which every deployment shares. It is how a rolling upgrade
//! is finalized, as CockroachDB finalizes a cluster version: a build that writes a new
//! format writes it only once every live instance reads it (`crate::db::formats`, the one
//! reader of the table), and writes the previous one meanwhile. Operators see in the same
//! table who runs what.

use super::sql::db_error;
use crate::clock::Clock;
use crate::db::{ColumnType, Pool, Sql};
use crate::engine::ledger::LedgerError;
use chrono::{DateTime, Utc};
use sqlx::{Executor, IntoArguments};
use std::sync::Arc;
use std::time::Duration;

pub use crate::db::FORMATS;

/// How often an instance announces itself.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(5);

/// Announces this instance every [`ANNOUNCE_EVERY`] on `clock`, until the task is aborted;
/// a failed announcement is logged and tried again next time.
pub(crate) fn spawn(pool: Pool, clock: Arc<dyn Clock>) -> tokio::task::JoinHandle<()> {
    let instance_id = uuid::Uuid::new_v4().simple().to_string();
    let started_at = clock.now();
    tokio::spawn(async move {
        loop {
            let seen_at = clock.now();
            let announced = match &pool {
                Pool::Postgres(pool) => announce(pool, &instance_id, started_at, seen_at).await,
                Pool::Sqlite(pool) => announce(pool, &instance_id, started_at, seen_at).await,
            };
            if let Err(error) = announced {
                static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %error, count, "announcing this instance failed; will try again");
                }
            }
            tokio::time::sleep(ANNOUNCE_EVERY).await;
        }
    })
}

/// Upserts this instance's row.
async fn announce<DB>(
    pool: &sqlx::Pool<DB>,
    instance_id: &str,
    started_at: DateTime<Utc>,
    seen_at: DateTime<Utc>,
) -> Result<(), LedgerError>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    String: ColumnType<DB>,
    i64: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
{
    sqlx::query(
        "INSERT INTO service_instances (instance_id, version, formats, started_at, seen_at) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (instance_id) DO UPDATE SET seen_at = excluded.seen_at",
    )
    .bind(instance_id.to_owned())
    .bind(env!("CARGO_PKG_VERSION").to_owned())
    .bind(FORMATS)
    .bind(started_at)
    .bind(seen_at)
    .execute(pool)
    .await
    .map_err(db_error)?;
    Ok(())
}
