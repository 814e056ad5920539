//! The ledger partitioned by day, on Postgres: `ledger_entries` becomes a table
//! partitioned by range of `at`, one partition a UTC day (`ledger_entries_pYYYYMMDD`),
//! created [`AHEAD_DAYS`] ahead by every instance, and retention drops whole partitions
//! instead of deleting rows. (SQLite keeps one table.)
//!
//! The migrations create an ordinary table, which the releases before this one write with
//! `ON CONFLICT (id)`: a partitioned table cannot keep `UNIQUE (id)` (a unique key must
//! hold the partition key), so such an insert would fail on it. The table is therefore
//! converted by the instances themselves, once every live instance writes with no
//! conflict target ([`Gate::PartitionedLedger`] in `service_instances`), and never by a
//! migration. One instance converts, holding an advisory lock; the others wait for it.
//!
//! The conversion moves no row. Online, while the drains go on:
//! 1. a `CHECK (at < bound)` is added `NOT VALID` and validated (a scan that blocks no
//!    insert), `bound` a UTC midnight at least [`BOUND_DAYS`] ahead;
//! 2. the unique indexes a partition needs, `(seq, at)` and `(id, at)`, are built
//!    `CONCURRENTLY`.
//!
//! Then, in one transaction that holds the table for an instant: the table is renamed
//! `ledger_entries_before_YYYYMMDD` (its bound), its indexes likewise; a partitioned
//! `ledger_entries` is created with the same columns, constraints, sequence, indexes and
//! rollup trigger; the old table is attached as its partition `MINVALUE..bound` (Postgres
//! takes the validated check as proof and the existing indexes as the partition's, so
//! nothing is scanned or built), and the first day's partition is created. Entries keep
//! their `seq`. The old partition is dropped whole once retention passes its bound; rows
//! older than the retention are deleted from it meanwhile, as before.
//!
//! An insert whose day has no partition yet (an instance's clock far ahead, a drain of
//! old entries after the days ahead were dropped) fails with no constraint named; the
//! store then creates the partitions of its entries' days and inserts again
//! ([`ensure_days`]).

use super::sql::db_error;
use crate::db::formats::Gate;
use crate::engine::ledger::LedgerError;
use chrono::{DateTime, Days, NaiveDate, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Days of partitions kept ready after today's.
pub const AHEAD_DAYS: u64 = 7;

/// The old table's bound, in days after the conversion's: the rows inserted while the
/// conversion runs (up to that midnight) still go to the old table.
pub const BOUND_DAYS: u64 = 7;

/// How often an instance looks at the partitions (converting, creating the days ahead).
pub const LOOK_EVERY: Duration = Duration::from_secs(300);

/// The advisory lock an instance holds while it looks ("qlparts" in ASCII).
const LOCK: i64 = 0x0071_6c70_6172_7473;

/// How long a statement of the conversion, the partitions' creation or retention waits
/// for a lock before it gives up (and is tried again later): a partition's creation and
/// drop take the parent table, and must not queue every insert behind a long reader.
const LOCK_TIMEOUT: &str = "2s";

/// The secondary indexes of `ledger_entries` (name suffix, columns): those the API's
/// queries, refunds, settlements and retention read, and the upgrade's partial index.
/// The parent gets each, named `ledger_entries_<suffix>`; each partition gets its own.
const INDEXES: [(&str, &str); 8] = [
    ("subject_seq_idx", "(subject, seq)"),
    ("action_seq_idx", "(action, seq)"),
    ("kind_seq_idx", "(kind, seq)"),
    ("action_kind_seq_idx", "(action, kind, seq)"),
    ("at_idx", "(at)"),
    (
        "consumption_idx",
        "(consumption_id) WHERE consumption_id IS NOT NULL",
    ),
    ("hold_idx", "(hold_id) WHERE hold_id IS NOT NULL"),
    ("compact_idx", "(seq) WHERE policies IS NULL"),
];

/// What a look at the partitions found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The ledger was partitioned already.
    Partitioned {
        /// Days whose partitions this look created.
        created: usize,
    },
    /// The ledger was converted by this look.
    Converted {
        /// Days whose partitions this look created.
        created: usize,
    },
    /// The ledger is not partitioned: a live instance reads formats up to `oldest` only
    /// (a release that inserts with `ON CONFLICT (id)`).
    Waiting {
        /// The oldest format a live instance reads.
        oldest: i64,
    },
    /// Another instance holds the lock.
    Busy,
}

/// An insert found no partition for an entry's day.
#[derive(Debug, thiserror::Error)]
#[error("no partition of the ledger for an entry's day: {0}")]
pub struct MissingPartition(pub String);

/// Whether `error` is [`MissingPartition`].
pub(crate) fn is_missing(error: &LedgerError) -> bool {
    matches!(error, LedgerError::Unavailable(cause) if cause.is::<MissingPartition>())
}

/// A partition of the ledger, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `ledger_entries_before_YYYYMMDD`: the table as it was, up to that midnight.
    Before(NaiveDate),
    /// `ledger_entries_pYYYYMMDD`: one UTC day.
    Day(NaiveDate),
}

impl Part {
    fn parse(name: &str) -> Option<Self> {
        let date = |digits: &str| NaiveDate::parse_from_str(digits, "%Y%m%d").ok();
        if let Some(digits) = name.strip_prefix("ledger_entries_before_") {
            date(digits).map(Part::Before)
        } else {
            name.strip_prefix("ledger_entries_p")
                .and_then(date)
                .map(Part::Day)
        }
    }

    fn name(self) -> String {
        match self {
            Part::Before(bound) => format!("ledger_entries_before_{}", bound.format("%Y%m%d")),
            Part::Day(day) => format!("ledger_entries_p{}", day.format("%Y%m%d")),
        }
    }

    /// The first day after the partition.
    fn end(self) -> NaiveDate {
        match self {
            Part::Before(bound) => bound,
            Part::Day(day) => next(day),
        }
    }
}

fn next(day: NaiveDate) -> NaiveDate {
    day.checked_add_days(Days::new(1)).unwrap_or(day)
}

/// Midnight (UTC) of `day`, as an SQL literal.
fn midnight(day: NaiveDate) -> String {
    format!("'{}T00:00:00Z'", day.format("%Y-%m-%d"))
}

/// Looks at the partitions with a connection of `pool` of its own (closed afterwards, so
/// that the session's advisory lock goes with it, whatever happened): converts the
/// ledger when every live instance can write to a partitioned one, and creates the days
/// ahead of `now`'s.
pub async fn look(pool: &PgPool, now: DateTime<Utc>) -> Result<Look, LedgerError> {
    let oldest = crate::db::formats::readable(&crate::db::Pool::Postgres(pool.clone()), now)
        .await
        .map_err(db_error)?;
    let mut conn = pool.acquire().await.map_err(db_error)?.detach();
    let look = look_on(&mut conn, now, oldest).await;
    let _ = conn.close().await;
    look
}

/// A ledger of fewer entries than this is converted by a start, before it serves; a
/// larger one by the looks of the running instances, in the background.
pub const CONVERT_AT_START_BELOW: i64 = 1_000_000;

/// The look of a start, before it serves: [`look`], unless the ledger is not partitioned
/// and holds [`CONVERT_AT_START_BELOW`] entries or more (`None`: left to the background).
pub(crate) async fn look_at_start(
    pool: &PgPool,
    now: DateTime<Utc>,
) -> Result<Option<Look>, LedgerError> {
    let mut conn = pool.acquire().await.map_err(db_error)?;
    if !partitioned(&mut conn).await? {
        let rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM ledger_entries LIMIT $1) AS firsts",
        )
        .bind(CONVERT_AT_START_BELOW)
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
        if rows >= CONVERT_AT_START_BELOW {
            return Ok(None);
        }
    }
    drop(conn);
    look(pool, now).await.map(Some)
}

/// [`look`] on the database at `database_url` (Postgres; a SQLite ledger is never
/// partitioned, and `None` is answered).
pub async fn look_url(database_url: &str, now: DateTime<Utc>) -> anyhow::Result<Option<Look>> {
    match crate::db::open(database_url, 1).await? {
        crate::db::Pool::Postgres(pool) => {
            let look = look(&pool, now).await;
            pool.close().await;
            Ok(Some(look?))
        }
        crate::db::Pool::Sqlite(pool) => {
            pool.close().await;
            Ok(None)
        }
    }
}

async fn look_on(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    oldest: i64,
) -> Result<Look, LedgerError> {
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(LOCK)
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    if !locked {
        return Ok(Look::Busy);
    }
    let today = now.date_naive();
    let ahead = (0..=AHEAD_DAYS).filter_map(|d| today.checked_add_days(Days::new(d)));
    if partitioned(conn).await? {
        let created = create_days(conn, ahead).await?;
        return Ok(Look::Partitioned { created });
    }
    if oldest < Gate::PartitionedLedger.needs() {
        return Ok(Look::Waiting { oldest });
    }
    convert(conn, today).await?;
    let created = create_days(conn, ahead).await?;
    Ok(Look::Converted { created })
}

/// Whether `ledger_entries` is partitioned.
async fn partitioned(conn: &mut PgConnection) -> Result<bool, LedgerError> {
    sqlx::query_scalar("SELECT relkind = 'p' FROM pg_class WHERE oid = 'ledger_entries'::regclass")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)
}

/// The partitions of `ledger_entries` (none when it is not partitioned).
async fn parts(conn: &mut PgConnection) -> Result<Vec<Part>, LedgerError> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'ledger_entries'::regclass",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    Ok(names.iter().filter_map(|name| Part::parse(name)).collect())
}

/// Creates the partitions of `days` that are missing (those the old table's bound covers
/// excepted), in one transaction; returns how many.
async fn create_days(
    conn: &mut PgConnection,
    days: impl Iterator<Item = NaiveDate>,
) -> Result<usize, LedgerError> {
    let mut tx = conn.begin().await.map_err(db_error)?;
    execute(
        &mut tx,
        &format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"),
    )
    .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(LOCK + 1)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    let parts = parts(&mut tx).await?;
    let bound = parts
        .iter()
        .find_map(|part| match part {
            Part::Before(bound) => Some(*bound),
            Part::Day(_) => None,
        })
        .unwrap_or(NaiveDate::MIN);
    let mut created = 0;
    for day in days.collect::<BTreeSet<_>>() {
        if day < bound || parts.contains(&Part::Day(day)) {
            continue;
        }
        let part = Part::Day(day);
        sqlx::query(&format!(
            "CREATE TABLE {} PARTITION OF ledger_entries FOR VALUES FROM ({}) TO ({})",
            part.name(),
            midnight(day),
            midnight(part.end())
        ))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // Postgres names a partition's indexes after their columns: named as the
        // parent's instead, so that each index has one name on every partition.
        for (columns, suffix) in [
            ("seq_idx", "compact_idx"),
            ("consumption_id_idx", "consumption_idx"),
            ("hold_id_idx", "hold_idx"),
        ] {
            let name = part.name();
            sqlx::query(&format!(
                "ALTER INDEX IF EXISTS {name}_{columns} RENAME TO {name}_{suffix}"
            ))
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        }
        created += 1;
    }
    tx.commit().await.map_err(db_error)?;
    Ok(created)
}

/// Creates the partitions of the days of `times` that are missing: what an insert that
/// found none needs before it is tried again.
pub(crate) async fn ensure_days(
    pool: &PgPool,
    times: impl Iterator<Item = DateTime<Utc>>,
) -> Result<usize, LedgerError> {
    let mut conn = pool.acquire().await.map_err(db_error)?;
    let created = create_days(&mut conn, times.map(|at| at.date_naive())).await?;
    if created > 0 {
        tracing::info!(created, "created the ledger's partitions an insert needed");
    }
    Ok(created)
}

/// Converts the ordinary `ledger_entries` into a partitioned one (see the module doc).
async fn convert(conn: &mut PgConnection, today: NaiveDate) -> Result<(), LedgerError> {
    let started = std::time::Instant::now();
    let soonest = today
        .checked_add_days(Days::new(1))
        .unwrap_or(NaiveDate::MAX);
    let bound = prepare_bound(conn, today, soonest).await?;
    for (name, columns) in [("seq_at", "(seq, at)"), ("id_at", "(id, at)")] {
        let index = format!("ledger_entries_before_{name}");
        // A build cut short leaves an invalid index behind: dropped, and built again.
        let invalid: Option<bool> = sqlx::query_scalar(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE c.relname = $1",
        )
        .bind(&index)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_error)?;
        if invalid == Some(true) {
            execute(conn, &format!("DROP INDEX CONCURRENTLY {index}")).await?;
        }
        execute(
            conn,
            &format!(
                "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {index} ON ledger_entries {columns}"
            ),
        )
        .await?;
    }
    let mut tx = conn.begin().await.map_err(db_error)?;
    for statement in switch_statements(bound) {
        sqlx::query(&statement)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
    }
    tx.commit().await.map_err(db_error)?;
    tracing::info!(
        before = %Part::Before(bound).name(),
        millis = started.elapsed().as_millis() as u64,
        "the ledger is partitioned by day"
    );
    Ok(())
}

/// The old table's bound: that of a check an earlier conversion added, when it is at
/// least `soonest`, or a new one [`BOUND_DAYS`] after `today`, added and validated.
async fn prepare_bound(
    conn: &mut PgConnection,
    today: NaiveDate,
    soonest: NaiveDate,
) -> Result<NaiveDate, LedgerError> {
    let checks: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'ledger_entries'::regclass AND conname LIKE 'ledger_entries_before_%'",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let mut kept = None;
    for check in checks {
        match Part::parse(&check) {
            Some(Part::Before(bound)) if bound >= soonest && kept.is_none() => {
                kept = Some(bound);
            }
            _ => {
                // Too close to keep inserts flowing until the switch: started again.
                let drop = format!("ALTER TABLE ledger_entries DROP CONSTRAINT {check}");
                execute(conn, &drop).await?;
            }
        }
    }
    let bound = match kept {
        Some(bound) => bound,
        None => {
            let bound = today
                .checked_add_days(Days::new(BOUND_DAYS))
                .unwrap_or(NaiveDate::MAX);
            execute(
                conn,
                &format!(
                    "ALTER TABLE ledger_entries ADD CONSTRAINT {} CHECK (at < {}) NOT VALID",
                    Part::Before(bound).name(),
                    midnight(bound)
                ),
            )
            .await?;
            bound
        }
    };
    let name = Part::Before(bound).name();
    execute(
        conn,
        &format!("ALTER TABLE ledger_entries VALIDATE CONSTRAINT {name}"),
    )
    .await?;
    Ok(bound)
}

async fn execute(conn: &mut PgConnection, statement: &str) -> Result<(), LedgerError> {
    sqlx::query(statement)
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// The statements of the conversion's one transaction (see the module doc).
fn switch_statements(bound: NaiveDate) -> Vec<String> {
    let before = Part::Before(bound).name();
    let mut out = vec![
        format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"),
        "LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE".to_owned(),
        format!("ALTER TABLE ledger_entries RENAME TO {before}"),
        format!("DROP TRIGGER ledger_entries_roll_up ON {before}"),
        format!("ALTER TABLE {before} DROP CONSTRAINT ledger_entries_pkey"),
        format!("ALTER TABLE {before} DROP CONSTRAINT ledger_entries_id_key"),
        format!(
            "ALTER TABLE {before} ADD CONSTRAINT ledger_entries_before_pkey \
             PRIMARY KEY USING INDEX ledger_entries_before_seq_at"
        ),
        format!(
            "ALTER TABLE {before} ADD CONSTRAINT ledger_entries_before_id_at_key \
             UNIQUE USING INDEX ledger_entries_before_id_at"
        ),
    ];
    for (suffix, _) in INDEXES {
        out.push(format!(
            "ALTER INDEX ledger_entries_{suffix} RENAME TO ledger_entries_before_{suffix}"
        ));
    }
    out.extend([
        format!(
            "CREATE TABLE ledger_entries \
             (LIKE {before} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (at)"
        ),
        format!("ALTER TABLE ledger_entries DROP CONSTRAINT {before}"),
        "ALTER SEQUENCE ledger_entries_seq_seq OWNED BY ledger_entries.seq".to_owned(),
        "ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_pkey PRIMARY KEY (seq, at)"
            .to_owned(),
        "ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_id_at_key UNIQUE (id, at)"
            .to_owned(),
    ]);
    for (suffix, columns) in INDEXES {
        out.push(format!(
            "CREATE INDEX ledger_entries_{suffix} ON ledger_entries {columns}"
        ));
    }
    out.extend([
        "CREATE TRIGGER ledger_entries_roll_up AFTER INSERT ON ledger_entries \
         REFERENCING NEW TABLE AS inserted \
         FOR EACH STATEMENT EXECUTE FUNCTION ledger_roll_up()"
            .to_owned(),
        format!(
            "ALTER TABLE ledger_entries ATTACH PARTITION {before} \
             FOR VALUES FROM (MINVALUE) TO ({})",
            midnight(bound)
        ),
    ]);
    out
}

/// Retention on a partitioned ledger: drops the partitions wholly before `cutoff`, then
/// deletes up to `batch` rows from before `cutoff` in the old table, if it is still
/// there; the rows removed. `None` when the ledger is not partitioned (retention then
/// deletes rows).
pub(crate) async fn retire(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    batch: u32,
) -> Result<Option<u64>, LedgerError> {
    let mut conn = pool.acquire().await.map_err(db_error)?;
    if !partitioned(&mut conn).await? {
        return Ok(None);
    }
    let mut removed = 0;
    let mut before = None;
    for part in parts(&mut conn).await? {
        if part.end() > cutoff.date_naive() {
            if let Part::Before(_) = part {
                before = Some(part);
            }
            continue;
        }
        let name = part.name();
        let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {name}"))
            .fetch_one(&mut *conn)
            .await
            .map_err(db_error)?;
        let mut tx = conn.begin().await.map_err(db_error)?;
        execute(
            &mut tx,
            &format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"),
        )
        .await?;
        execute(&mut tx, &format!("DROP TABLE {name}")).await?;
        tx.commit().await.map_err(db_error)?;
        tracing::info!(partition = %name, rows, "ledger retention dropped a partition");
        removed += u64::try_from(rows).unwrap_or(0);
    }
    if let Some(part) = before {
        let name = part.name();
        let done = sqlx::query(&format!(
            "DELETE FROM {name} WHERE seq IN \
             (SELECT seq FROM {name} WHERE at < $1 ORDER BY at LIMIT $2)"
        ))
        .bind(cutoff)
        .bind(i64::from(batch))
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
        removed += done.rows_affected();
    }
    Ok(Some(removed))
}

/// Looks at the partitions every [`LOOK_EVERY`] on `clock` (the start looked first),
/// until the task is aborted; what went wrong is logged, and tried again at the next
/// look.
pub(crate) fn spawn(
    pool: PgPool,
    clock: Arc<dyn crate::clock::Clock>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut waiting_said = false;
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            match look(&pool, clock.now()).await {
                Ok(Look::Converted { created }) | Ok(Look::Partitioned { created })
                    if created > 0 =>
                {
                    tracing::info!(created, "created the ledger's partitions ahead");
                }
                Ok(Look::Waiting { oldest }) if !waiting_said => {
                    waiting_said = true;
                    tracing::info!(
                        oldest,
                        "the ledger stays one table until no instance of an earlier release \
                         is live (they insert with ON CONFLICT (id))"
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                    if let Some(count) = SITE.event() {
                        let cause = std::error::Error::source(&error).map(ToString::to_string);
                        tracing::warn!(error = %error, cause = cause.as_deref(), count, "looking at the ledger's partitions failed; will try again");
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
