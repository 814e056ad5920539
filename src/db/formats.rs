//! The persisted formats and the upgrade gates, in one place.
//!
//! Every running instance announces in `service_instances` the newest format version it
//! reads ([`FORMATS`]; `crate::ledger::instances` writes the rows). A build that writes
//! something an older build cannot read writes it only once every instance seen within
//! [`LIVE_FOR`] reads its [`Gate`]'s version, as CockroachDB finalizes a cluster version.
//! [`oldest_live`] is the one reader of that table: the gates of the policy store, the
//! payments API and the ledger's partitions all ask it.

use super::{ColumnType, Sql};
use chrono::{DateTime, Utc};
use sqlx::{Executor, IntoArguments};

/// The newest version of the persisted formats (ledger rows, stream entries, counter-store
/// records, snapshots, and the tables every instance must read alike) this build reads. A
/// build that changes one bumps it, reads the formats of the version before, and writes
/// its own only once every live instance reads it.
///
/// - 1: the formats of 0.1.0.
/// - 2: API keys, the policy shapes 0.1.0 cannot read, and over-captured commits
///   ([`Gate::ApiKeys`], [`Gate::PolicyShapes`], [`Gate::OverCapture`]).
/// - 3: a partitioned ledger (Postgres, [`Gate::PartitionedLedger`]).
/// - 4: policies that record totals ([`Gate::RecordTotals`]).
pub const FORMATS: i64 = 4;

/// An instance not seen in `service_instances` for this long is gone (a dozen missed
/// announcements).
pub(crate) const LIVE_FOR: chrono::Duration = chrono::Duration::seconds(60);

/// What a build writes only once every live instance reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Creating an API key: a build that reads only format 1 would not enforce it.
    ApiKeys,
    /// Writing a policy with a calendar window with anchors or a `year` period, a
    /// `request` or `lifetime` window, a `match_not` or alert thresholds: 0.1.0 would
    /// misread the window, apply the policy to requests it excludes, or not report.
    PolicyShapes,
    /// Committing a hold for more than it holds: 0.1.0 would take it for a give-back.
    OverCapture,
    /// Converting the ledger to daily partitions (Postgres): inserts then name no
    /// conflict target and create a missing day's partition.
    PartitionedLedger,
    /// Writing a policy that records totals (`record: totals`): an older build would
    /// write an entry for each of its consumes and never add to the ledger's totals.
    RecordTotals,
}

impl Gate {
    /// The format version every live instance must read before this gate opens.
    pub const fn needs(self) -> i64 {
        match self {
            Self::ApiKeys | Self::PolicyShapes | Self::OverCapture => 2,
            Self::PartitionedLedger => 3,
            Self::RecordTotals => 4,
        }
    }
}

/// The instance seen within [`LIVE_FOR`] of `now` that reads the oldest formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oldest {
    /// The newest format version it reads.
    pub formats: i64,
    /// The release it runs.
    pub version: String,
}

impl Oldest {
    /// The version of the oldest live instance in `oldest` if it keeps `gate` closed.
    pub fn blocking(oldest: Option<&Self>, gate: Gate) -> Option<&str> {
        oldest
            .filter(|o| o.formats < gate.needs())
            .map(|o| o.version.as_str())
    }

    /// The newest format version every live instance in `oldest` reads ([`FORMATS`]
    /// when none is live but this one): what this build may write.
    pub fn readable(oldest: Option<&Self>) -> i64 {
        oldest.map_or(FORMATS, |o| o.formats).min(FORMATS)
    }
}

/// The live instance (seen within [`LIVE_FOR`] of `now`) that reads the oldest formats,
/// `None` when no instance is live; read on `conn`, inside a change when the gate must
/// hold until it commits.
pub(crate) async fn oldest_live<DB>(
    conn: &mut DB::Connection,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Oldest>>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    DateTime<Utc>: ColumnType<DB>,
    (i64, String): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let row: Option<(i64, String)> = sqlx::query_as(
        "SELECT formats, version FROM service_instances WHERE seen_at >= $1 \
         ORDER BY formats, seen_at DESC LIMIT 1",
    )
    .bind(now - LIVE_FOR)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(formats, version)| Oldest { formats, version }))
}

/// [`Oldest::readable`] of the instances live at `now` in `pool`'s database: the newest
/// format version this build may write.
pub async fn readable(pool: &super::Pool, now: DateTime<Utc>) -> sqlx::Result<i64> {
    let oldest = match pool {
        super::Pool::Postgres(pool) => {
            oldest_live::<sqlx::Postgres>(&mut *pool.acquire().await?, now).await?
        }
        super::Pool::Sqlite(pool) => {
            oldest_live::<sqlx::Sqlite>(&mut *pool.acquire().await?, now).await?
        }
    };
    Ok(Oldest::readable(oldest.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oldest(formats: i64) -> Oldest {
        Oldest {
            formats,
            version: format!("0.{formats}.0"),
        }
    }

    #[test]
    fn a_gate_opens_once_every_live_instance_reads_its_version() {
        for gate in [
            Gate::ApiKeys,
            Gate::PolicyShapes,
            Gate::OverCapture,
            Gate::PartitionedLedger,
            Gate::RecordTotals,
        ] {
            assert!(
                gate.needs() <= FORMATS,
                "{gate:?} needs a format this build reads"
            );
            assert_eq!(Oldest::blocking(None, gate), None);
            assert_eq!(Oldest::blocking(Some(&oldest(gate.needs())), gate), None);
            let behind = oldest(gate.needs() - 1);
            assert_eq!(
                Oldest::blocking(Some(&behind), gate),
                Some(behind.version.as_str())
            );
        }
        assert_eq!(Oldest::readable(None), FORMATS);
        assert_eq!(Oldest::readable(Some(&oldest(1))), 1);
        assert_eq!(Oldest::readable(Some(&oldest(FORMATS + 1))), FORMATS);
    }

    #[tokio::test]
    async fn the_oldest_live_instance_is_the_one_that_reads_the_oldest_formats() {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("an in-memory SQLite");
        sqlx::query(
            "CREATE TABLE service_instances (instance_id TEXT PRIMARY KEY, version TEXT, \
             formats INTEGER, started_at TEXT, seen_at TEXT)",
        )
        .execute(&mut conn)
        .await
        .expect("the table");
        let now = Utc::now();
        for (id, version, formats, seen) in [
            ("a", "0.2.0", 3, now),
            (
                "b",
                "0.1.0",
                1,
                now - LIVE_FOR - chrono::Duration::seconds(1),
            ),
            ("c", "0.1.1", 2, now - chrono::Duration::seconds(5)),
        ] {
            sqlx::query("INSERT INTO service_instances VALUES ($1, $2, $3, $4, $4)")
                .bind(id)
                .bind(version)
                .bind(formats)
                .bind(seen)
                .execute(&mut conn)
                .await
                .expect("a row");
        }
        let found = oldest_live::<sqlx::Sqlite>(&mut conn, now)
            .await
            .expect("read");
        assert_eq!(
            found,
            Some(Oldest {
                formats: 2,
                version: "0.1.1".to_owned()
            }),
            "b is gone (not seen for longer than LIVE_FOR); c reads the oldest of the rest"
        );
        let later = now + LIVE_FOR + chrono::Duration::seconds(1);
        assert_eq!(
            oldest_live::<sqlx::Sqlite>(&mut conn, later)
                .await
                .expect("read"),
            None
        );
    }
}
