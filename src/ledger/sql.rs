//! The SQL ledger stores: Postgres in production, SQLite as the embedded default.
//!
//! Both speak the same SQL, so one [`SqlLedgerStore`], generic over the database, serves
//! both, as for the policy stores. The schema is applied by `db::migrate` (one migration set per
//! database); this module only reads and writes `ledger_entries`.
//!
//! Pages are keyed by `seq`, the insertion order, not by time: an entry inserted while a
//! client walks the pages gets a higher `seq` than any cursor already handed out, so it
//! can never shift a later page (no duplicates, no gaps among the entries that were there).

use super::cursor::{decode_cursor, encode_cursor};
use super::rows::{folded_column, folded_ids_column, page_sql, PageRow, RowValues};
use crate::db::{ColumnType, Sql};
use crate::domain::{Action, ConsumptionId, EntryId, EntryKind, HoldId, LedgerEntry};
use crate::engine::alerts::{self, AlertEvent};
use crate::engine::codec::{self, AttributesColumn, PoliciesColumn};
use crate::engine::ledger::{
    DeniedSubject, HourActivity, LedgerError, LedgerFilter, LedgerPage, LedgerStore, MAX_PAGE,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::error::ErrorKind;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Database, Encode, Executor, IntoArguments, QueryBuilder, Row, Type};
use std::collections::HashMap;
use std::sync::Arc;

/// The ledger in Postgres (production) or in a local SQLite file (the embedded default).
#[derive(Debug)]
pub(crate) struct SqlLedgerStore<DB: Database> {
    /// The connection pool (Postgres: the ledger's own, so its batches never starve admin
    /// requests).
    pub(crate) pool: sqlx::Pool<DB>,
}

/// Opens the ledger that `database_url` names: `postgres://…` or `sqlite://…`.
///
/// Does not migrate: `crate::db::migrate` must have run first.
pub async fn connect(database_url: &str) -> anyhow::Result<Arc<dyn LedgerStore>> {
    Ok(
        match crate::db::open_with(database_url, 8, &SQLITE_PRAGMAS).await? {
            crate::db::Pool::Postgres(pool) => Arc::new(SqlLedgerStore { pool }),
            crate::db::Pool::Sqlite(pool) => Arc::new(SqlLedgerStore { pool }),
        },
    )
}

/// The SQLite ledger connections' settings:
/// - a page cache of 32 MiB (SQLite's default is 2 MiB), so that the indexes' pages an
///   insert touches stay in memory as the ledger grows. Each entry lands on a random page
///   of the subject index: with the default cache the drain's cost per entry rose by half
///   over the first million entries;
/// - temporary files in memory. A transaction of several statements (the drain's batches
///   of up to 5,000 entries, 500 per statement) keeps a statement journal of every page
///   each statement changes, so that one statement can be rolled back alone; on disk those
///   writes were a fifth of SQLite's time in the drain, which fell behind a full load
///   (ledger lag p99 10 s, now under 1 s). It holds one statement's pages at most.
const SQLITE_PRAGMAS: [(&str, &str); 2] = [("cache_size", "-32768"), ("temp_store", "memory")];

/// Rows per `INSERT` statement: 15 parameters each stays far below both databases'
/// parameter limits (Postgres 65,535; SQLite 32,766).
pub(super) const ROWS_PER_INSERT: usize = 500;

/// Retention's statement: the oldest `$2` entries from before `$1`, found through the
/// `at` index. (Ordered by `seq` instead, both databases walked the whole table in `seq`
/// order whenever nothing was old enough, and SQLite held its write lock, stalling every
/// embedded consume, for as long: 60 ms at a million entries.)
pub(crate) const RETENTION_DELETE: &str = "DELETE FROM ledger_entries WHERE seq IN \
     (SELECT seq FROM ledger_entries WHERE at < $1 ORDER BY at LIMIT $2)";

/// Raises one shard's write generation floor, never lowers it (Postgres and SQLite alike).
const RECORD_GENERATION: &str = "INSERT INTO redis_generations (prefix, shard, generation) \
     VALUES ($1, $2, $3) ON CONFLICT (prefix, shard) DO UPDATE SET generation = excluded.generation \
     WHERE excluded.generation > redis_generations.generation";

/// The columns of `ledger_entries` that hold an entry, in the order inserts bind them.
const ENTRY_COLUMNS: &str = "id, at, kind, action, subject, amount, consumption_id, hold_id, \
     idempotency_key, policies, detail, attributes, totals, folded, folded_ids";

/// [`ENTRY_COLUMNS`] as selects read them: with the compact text of rows written before
/// `policies` was JSON, until `quota-ledger migrate` has rewritten them ([`upgrade`]).
pub(super) const READ_COLUMNS: &str =
    "id, at, kind, action, subject, amount, consumption_id, hold_id, \
     idempotency_key, policies, detail, attributes, policies_compact, totals, folded, folded_ids";

/// Sorts a database failure: a broken constraint is a bug in what we tried to store
/// (retrying cannot help); anything else is the database being unavailable.
pub(super) fn db_error(error: sqlx::Error) -> LedgerError {
    match &error {
        // Postgres: an insert found no partition for an entry's day (a check that fails
        // names its constraint).
        sqlx::Error::Database(db)
            if db.code().as_deref() == Some("23514") && db.constraint().is_none() =>
        {
            LedgerError::unavailable(super::partitions::MissingPartition(db.message().to_owned()))
        }
        sqlx::Error::Database(db) if db.kind() != ErrorKind::Other => {
            LedgerError::Corrupt(format!("an entry breaks a constraint: {db}"))
        }
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            LedgerError::Corrupt(error.to_string())
        }
        _ => LedgerError::unavailable(error),
    }
}

/// A row that no longer parses: which entry, and why.
pub(super) fn corrupt(what: &str, error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Corrupt(format!("{what}: {error}"))
}

/// A count or amount as the BIGINT column holds it.
pub(super) fn column_amount(id: &str, value: u64) -> Result<i64, LedgerError> {
    i64::try_from(value).map_err(|_| corrupt(id, "amount exceeds the largest BIGINT"))
}

impl<DB> SqlLedgerStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Json<Value>: ColumnType<DB>,
    Option<Json<Value>>: ColumnType<DB>,
    Json<PoliciesColumn>: ColumnType<DB>,
    Option<Json<PoliciesColumn>>: ColumnType<DB>,
    Option<Json<AttributesColumn>>: ColumnType<DB>,
    Option<i64>: ColumnType<DB>,
{
    /// A row of `ledger_entries` (its [`ENTRY_COLUMNS`]) as a [`LedgerEntry`].
    fn entry_from_row(row: &DB::Row) -> Result<LedgerEntry, LedgerError> {
        let values = RowValues {
            id: row.try_get("id").map_err(db_error)?,
            at: row.try_get("at").map_err(db_error)?,
            kind: row.try_get("kind").map_err(db_error)?,
            action: row.try_get("action").map_err(db_error)?,
            subject: row.try_get("subject").map_err(db_error)?,
            amount: row.try_get("amount").map_err(db_error)?,
            consumption_id: row.try_get("consumption_id").map_err(db_error)?,
            hold_id: row.try_get("hold_id").map_err(db_error)?,
            idempotency_key: row.try_get("idempotency_key").map_err(db_error)?,
            policies: row
                .try_get::<Option<Json<PoliciesColumn>>, _>("policies")
                .map_err(db_error)?
                .map(|Json(p)| p),
            detail: row.try_get("detail").map_err(db_error)?,
            attributes: row
                .try_get::<Option<Json<AttributesColumn>>, _>("attributes")
                .map_err(db_error)?
                .map(|Json(a)| a),
            compact: row.try_get("policies_compact").map_err(db_error)?,
            totals: row
                .try_get::<Option<Json<Value>>, _>("totals")
                .map_err(db_error)?
                .map(|Json(t)| t),
            folded_ids: row.try_get("folded_ids").map_err(db_error)?,
        };
        values.entry()
    }

    /// A row of `seq` and [`ENTRY_COLUMNS`] as the entry and its `seq`.
    fn seq_and_entry(row: &DB::Row) -> Result<(i64, LedgerEntry), LedgerError> {
        let seq: i64 = row.try_get("seq").map_err(db_error)?;
        Ok((seq, Self::entry_from_row(row)?))
    }

    /// The pool, when the ledger is on Postgres.
    fn postgres(&self) -> Option<&sqlx::PgPool> {
        (&self.pool as &dyn std::any::Any).downcast_ref()
    }

    /// One try of [`LedgerStore::append`]: `entries` and the alert `events` they record,
    /// in one transaction.
    async fn append_once(
        &self,
        entries: &[LedgerEntry],
        events: &[AlertEvent],
    ) -> Result<u64, LedgerError> {
        if let Some(pool) = self.postgres() {
            return super::copy::append(pool, entries, events).await;
        }
        if entries.len() <= ROWS_PER_INSERT && events.is_empty() {
            // One statement is atomic by itself. Without an explicit transaction around it,
            // SQLite keeps no statement journal: a sixth of its work for the small batches
            // of the embedded writer.
            let mut conn = self.pool.acquire().await.map_err(db_error)?;
            return Self::insert_chunk(&mut conn, entries).await;
        }
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let mut inserted = 0;
        for chunk in entries.chunks(ROWS_PER_INSERT) {
            inserted += Self::insert_chunk(&mut tx, chunk).await?;
        }
        for chunk in events.chunks(ROWS_PER_INSERT) {
            Self::insert_events(&mut tx, chunk).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(inserted)
    }

    /// Inserts one chunk of entries in one statement; returns how many were new.
    async fn insert_chunk(
        conn: &mut DB::Connection,
        chunk: &[LedgerEntry],
    ) -> Result<u64, LedgerError> {
        let mut rows = Vec::with_capacity(chunk.len());
        for e in chunk {
            let id = e.id.to_string();
            let amount = column_amount(&id, e.amount)?;
            rows.push((e, id, amount));
        }
        let mut sql =
            QueryBuilder::<DB>::new(format!("INSERT INTO ledger_entries ({ENTRY_COLUMNS}) "));
        sql.push_values(rows, |mut b, (e, id, amount)| {
            b.push_bind(id)
                .push_bind(e.at)
                .push_bind(e.kind.as_str())
                .push_bind(e.action.to_string())
                .push_bind(e.subject.to_string())
                .push_bind(amount)
                .push_bind(e.consumption_id.map(|id| id.to_string()))
                .push_bind(e.hold_id.map(|id| id.to_string()))
                .push_bind(e.idempotency_key.as_ref().map(ToString::to_string))
                .push_bind(Json(codec::policies_column(
                    &e.policies,
                    &e.subject,
                    &e.attributes,
                )))
                .push_bind(codec::encode_detail(e))
                .push_bind(codec::attributes_column(&e.attributes).map(Json))
                .push_bind(codec::totals_column(&e.totals).map(Json))
                .push_bind(folded_column(e))
                .push_bind(folded_ids_column(e));
        });
        // No conflict target: an entry already there (its id, unique) is skipped whether
        // the unique index is on `id` alone or, once the ledger is partitioned by time, on
        // `(id, at)`, which an entry inserted again repeats.
        sql.push(" ON CONFLICT DO NOTHING");
        let done = DB::build(&mut sql).execute(conn).await.map_err(db_error)?;
        Ok(DB::rows_affected(&done))
    }

    /// Adds alert events to the outbox; those already there (an entry inserted again) are
    /// left as they are.
    pub(super) async fn insert_events(
        conn: &mut DB::Connection,
        events: &[AlertEvent],
    ) -> Result<(), LedgerError> {
        let mut sql =
            QueryBuilder::<DB>::new("INSERT INTO alert_events (id, event_type, at, payload) ");
        sql.push_values(events, |mut b, event| {
            b.push_bind(event.id.clone())
                .push_bind(event.event_type.to_owned())
                .push_bind(event.at)
                .push_bind(Json(event.payload.clone()));
        });
        sql.push(" ON CONFLICT (id) DO NOTHING");
        DB::build(&mut sql).execute(conn).await.map_err(db_error)?;
        Ok(())
    }

    /// The newest `limit` entries matching `filter` with a `seq` below `before`, each with
    /// its `seq`.
    async fn select_page(
        &self,
        filter: &LedgerFilter,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<(i64, LedgerEntry)>, LedgerError> {
        let mut sql = super::query::page_query::<DB>(filter, before, limit);
        let rows = DB::build(&mut sql)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(Self::seq_and_entry).collect()
    }

    /// The first entry of `kind` whose `column` is `value`.
    async fn first_of(
        &self,
        column: &str,
        value: &str,
        kind: EntryKind,
    ) -> Result<Option<LedgerEntry>, LedgerError> {
        let sql = format!(
            "SELECT {READ_COLUMNS} FROM ledger_entries \
             WHERE {column} = $1 AND kind = $2 ORDER BY seq LIMIT 1"
        );
        let row = sqlx::query(&sql)
            .bind(value)
            .bind(kind.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.as_ref().map(Self::entry_from_row).transpose()
    }
}

#[async_trait]
impl<DB> LedgerStore for SqlLedgerStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Json<Value>: ColumnType<DB>,
    Option<Json<Value>>: ColumnType<DB>,
    Json<PoliciesColumn>: ColumnType<DB>,
    Option<Json<PoliciesColumn>>: ColumnType<DB>,
    Option<Json<AttributesColumn>>: ColumnType<DB>,
    Option<i64>: ColumnType<DB>,
{
    async fn append(&self, entries: &[LedgerEntry]) -> Result<u64, LedgerError> {
        if entries.is_empty() {
            return Ok(0);
        }
        // The alert events the entries record go in with them (engine::alerts).
        let events: Vec<AlertEvent> = entries.iter().flat_map(alerts::events_of).collect();
        match self.append_once(entries, &events).await {
            Err(error) if super::partitions::is_missing(&error) => {
                let Some(pool) = self.postgres() else {
                    return Err(error);
                };
                super::partitions::ensure_days(pool, entries.iter().map(|e| e.at)).await?;
                self.append_once(entries, &events).await
            }
            done => done,
        }
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql ledger page", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn page(
        &self,
        filter: &LedgerFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<LedgerPage, LedgerError> {
        let before = cursor.map(decode_cursor).transpose()?;
        let limit = limit.clamp(1, MAX_PAGE) as usize;
        // One row more than asked tells whether an older page exists.
        let mut rows = self.select_page(filter, before, limit as i64 + 1).await?;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = match (more, rows.last()) {
            (true, Some((seq, _))) => Some(encode_cursor(*seq)),
            _ => None,
        };
        Ok(LedgerPage {
            items: rows.into_iter().map(|(_, entry)| entry).collect(),
            next_cursor,
        })
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql ledger charge_of", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn charge_of(
        &self,
        consumption_id: ConsumptionId,
    ) -> Result<Option<LedgerEntry>, LedgerError> {
        let id = consumption_id.to_string();
        self.first_of("consumption_id", &id, EntryKind::Charge)
            .await
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql ledger hold_of", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn hold_of(&self, hold_id: HoldId) -> Result<Option<LedgerEntry>, LedgerError> {
        self.first_of("hold_id", &hold_id.to_string(), EntryKind::Hold)
            .await
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql ledger refunded", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn refunded(&self, consumption_id: ConsumptionId) -> Result<u64, LedgerError> {
        let consumption_id = consumption_id.to_string();
        // Postgres sums BIGINT as NUMERIC: cast back (refunds never exceed the charge,
        // itself at most 2^53 - 1).
        let total: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM ledger_entries \
             WHERE consumption_id = $1 AND kind = 'refund'",
        )
        .bind(&consumption_id)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        u64::try_from(total).map_err(|e| corrupt(&consumption_id, e))
    }

    async fn refunded_before(
        &self,
        consumption_id: ConsumptionId,
        seq: i64,
    ) -> Result<u64, LedgerError> {
        let consumption_id = consumption_id.to_string();
        let total: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM ledger_entries \
             WHERE consumption_id = $1 AND kind = 'refund' AND seq < $2",
        )
        .bind(&consumption_id)
        .bind(seq)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        u64::try_from(total).map_err(|e| corrupt(&consumption_id, e))
    }

    async fn add_events(&self, events: &[AlertEvent]) -> Result<(), LedgerError> {
        if let Some(pool) = self.postgres() {
            return super::copy::add_events(pool, events).await;
        }
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        for chunk in events.chunks(ROWS_PER_INSERT) {
            Self::insert_events(&mut conn, chunk).await?;
        }
        Ok(())
    }

    async fn settled_seq(&self) -> Result<Option<i64>, LedgerError> {
        if let Some(pool) = self.postgres() {
            return crate::db::appends::settled_seq(pool, crate::db::appends::Followed::Entries)
                .await
                .map_err(db_error);
        }
        // SQLite has one writer at a time: the entries committed are a prefix of `seq`s.
        sqlx::query_scalar("SELECT max(seq) FROM ledger_entries")
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn seqs_of(&self, ids: &[String]) -> Result<HashMap<String, i64>, LedgerError> {
        let mut seqs = HashMap::new();
        for chunk in ids.chunks(500) {
            let mut sql =
                QueryBuilder::<DB>::new("SELECT id, seq FROM ledger_entries WHERE id IN (");
            let mut list = sql.separated(", ");
            for id in chunk {
                list.push_bind(id.as_str());
            }
            sql.push(")");
            let rows = DB::build(&mut sql)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
            for row in rows {
                seqs.insert(
                    row.try_get::<String, _>("id").map_err(db_error)?,
                    row.try_get::<i64, _>("seq").map_err(db_error)?,
                );
            }
        }
        Ok(seqs)
    }

    async fn folded_in(&self, id: EntryId, at: DateTime<Utc>) -> Result<bool, LedgerError> {
        self.folded_row_of(id, at).await
    }

    async fn first_seq_since(&self, at: DateTime<Utc>) -> Result<Option<i64>, LedgerError> {
        // The at index holds each row's seq (SQLite: the rowid; Postgres reads it).
        sqlx::query_scalar("SELECT MIN(seq) FROM ledger_entries WHERE at >= $1")
            .bind(at)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn entries_after(
        &self,
        after: i64,
        limit: u32,
        action: Option<&Action>,
    ) -> Result<Vec<(i64, LedgerEntry)>, LedgerError> {
        let sql = page_sql(DB::DIALECT, action.is_some());
        let mut query = sqlx::query_scalar(&sql).bind(after).bind(i64::from(limit));
        if let Some(action) = action {
            query = query.bind(action.as_str());
        }
        let text: Option<String> = query.fetch_one(&self.pool).await.map_err(db_error)?;
        let rows: Vec<PageRow> = serde_json::from_str(text.as_deref().unwrap_or("[]"))
            .map_err(|e| LedgerError::Corrupt(format!("a page of the ledger: {e}")))?;
        let mut page = rows
            .into_iter()
            .map(|row| {
                let (seq, values) = RowValues::of_page(row)?;
                Ok((seq, values.entry()?))
            })
            .collect::<Result<Vec<_>, LedgerError>>()?;
        // An aggregate's order is the database's to choose: in insertion order again.
        page.sort_by_key(|(seq, _)| *seq);
        Ok(page)
    }

    async fn activity(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
    ) -> Result<Vec<HourActivity>, LedgerError> {
        self.select_activity(from, to, action).await
    }

    async fn top_denied(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeniedSubject>, LedgerError> {
        self.select_top_denied(from, to, action, limit).await
    }

    fn appends_in_parallel(&self) -> bool {
        self.postgres().is_some()
    }

    async fn record_generations(
        &self,
        prefix: &str,
        generations: &[(u16, u64)],
    ) -> Result<(), LedgerError> {
        for &(shard, generation) in generations {
            let generation = i64::try_from(generation)
                .map_err(|_| corrupt("a write generation", "above the largest BIGINT"))?;
            sqlx::query(RECORD_GENERATION)
                .bind(prefix)
                .bind(i64::from(shard))
                .bind(generation)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        Ok(())
    }

    async fn generations(&self, prefix: &str) -> Result<Vec<(u16, u64)>, LedgerError> {
        let rows = sqlx::query("SELECT shard, generation FROM redis_generations WHERE prefix = $1")
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| {
                let shard: i64 = row.try_get("shard").map_err(db_error)?;
                let generation: i64 = row.try_get("generation").map_err(db_error)?;
                match (u16::try_from(shard), u64::try_from(generation)) {
                    (Ok(shard), Ok(generation)) => Ok((shard, generation)),
                    _ => Err(corrupt("a write generation", "out of range")),
                }
            })
            .collect()
    }

    async fn delete_older_than(
        &self,
        cutoff: DateTime<Utc>,
        batch: u32,
    ) -> Result<u64, LedgerError> {
        // A partitioned ledger (Postgres) drops its partitions whole.
        let retired = match self.postgres() {
            Some(pool) => super::partitions::retire(pool, cutoff, batch).await?,
            None => None,
        };
        let deleted = match retired {
            Some(removed) => removed,
            None => {
                // One short statement per batch: locks only the rows it deletes, briefly.
                let done = sqlx::query(RETENTION_DELETE)
                    .bind(cutoff)
                    .bind(i64::from(batch))
                    .execute(&self.pool)
                    .await
                    .map_err(db_error)?;
                DB::rows_affected(&done)
            }
        };
        // The rollups of the hours that ended before the cutoff: all of their entries
        // are gone (the cutoff's own hour stays until the next sweep passes it).
        let hour = cutoff.timestamp().div_euclid(3_600);
        for table in ["ledger_hourly", "ledger_hourly_denials"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE hour < $1"))
                .bind(hour)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        Ok(deleted)
    }
}

#[cfg(test)]
pub(super) mod tests;
