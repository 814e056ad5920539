//! Rows migrated forward: ledger rows written before `policies` was readable JSON keep
//! their compact text in `policies_compact` (and `policies` NULL) after the schema
//! migration; [`upgrade_url`] rewrites them, a batch per transaction in `seq` order, so
//! that every row reads in SQL. `quota-ledger migrate` and every start (before it serves)
//! run it after the schema migrations. Readers take either form (`ledger::sql`), so an
//! upgrade cut short leaves a ledger that reads, and the next run resumes it.

use super::sql::{db_error, SqlLedgerStore};
use crate::db::{ColumnType, Sql};
use crate::domain::{Attributes, Subject};
use crate::engine::codec::{self, AttributesColumn, PoliciesColumn};
use crate::engine::ledger::LedgerError;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Executor, IntoArguments, Row};

/// Rows rewritten per transaction.
const BATCH: i64 = 1_000;

/// The next rows still in the compact form after `seq` `$1`, at most `$2`: through the
/// partial index `ledger_entries_compact_idx`, empty once every row is rewritten, so that
/// the look every start takes never reads the ledger.
pub const COMPACT_ROWS: &str = "SELECT seq, subject, amount, attributes, policies_compact \
     FROM ledger_entries WHERE seq > $1 AND policies IS NULL ORDER BY seq LIMIT $2";

/// Rewrites every row of the ledger at `database_url` whose `policies` is still compact
/// text; returns how many it rewrote.
pub async fn upgrade_url(database_url: &str) -> anyhow::Result<u64> {
    let rewritten = match crate::db::open_with(database_url, 1, &[]).await? {
        crate::db::Pool::Postgres(pool) => SqlLedgerStore { pool }.upgrade().await?,
        crate::db::Pool::Sqlite(pool) => SqlLedgerStore { pool }.upgrade().await?,
    };
    if rewritten > 0 {
        tracing::info!(
            rewritten,
            "rewrote ledger rows written before the ledger was readable in SQL"
        );
    }
    Ok(rewritten)
}

impl<DB> SqlLedgerStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    Json<PoliciesColumn>: ColumnType<DB>,
    Option<Json<AttributesColumn>>: ColumnType<DB>,
    Option<i64>: ColumnType<DB>,
{
    /// Rewrites every row whose `policies` is still compact text; returns how many.
    pub(crate) async fn upgrade(&self) -> Result<u64, LedgerError> {
        let (mut after, mut rewritten) = (0_i64, 0_u64);
        loop {
            let rows = sqlx::query(COMPACT_ROWS)
                .bind(after)
                .bind(BATCH)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
            let Some(last) = rows.last() else {
                return Ok(rewritten);
            };
            after = last.try_get("seq").map_err(db_error)?;
            let mut tx = self.pool.begin().await.map_err(db_error)?;
            for row in &rows {
                let (seq, policies) = Self::readable(row)?;
                sqlx::query(
                    "UPDATE ledger_entries SET policies = $1, policies_compact = '' \
                     WHERE seq = $2",
                )
                .bind(Json(policies))
                .bind(seq)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                rewritten += 1;
            }
            tx.commit().await.map_err(db_error)?;
        }
    }

    /// A row's `seq` and its `policies` as JSON, from its compact text.
    fn readable(row: &DB::Row) -> Result<(i64, PoliciesColumn), LedgerError> {
        let seq: i64 = row.try_get("seq").map_err(db_error)?;
        let corrupt = |e: codec::CodecError| LedgerError::Corrupt(format!("row {seq}: {e}"));
        let subject: String = row.try_get("subject").map_err(db_error)?;
        let subject = Subject::parse("subject", &subject)
            .map_err(|e| LedgerError::Corrupt(format!("row {seq}: {e}")))?;
        let amount: i64 = row.try_get("amount").map_err(db_error)?;
        let amount = u64::try_from(amount).unwrap_or_default();
        let attributes: Option<Json<AttributesColumn>> =
            row.try_get("attributes").map_err(db_error)?;
        let attributes: Attributes =
            codec::attributes_from_column(attributes.map(|Json(v)| v)).map_err(corrupt)?;
        let compact: Option<String> = row.try_get("policies_compact").map_err(db_error)?;
        let policies = match compact.as_deref() {
            // The column's default: a row without policies.
            None | Some("" | "[]") => Vec::new(),
            Some(compact) => codec::decode_policies(compact, amount).map_err(corrupt)?,
        };
        Ok((
            seq,
            codec::policies_column(&policies, &subject, &attributes),
        ))
    }
}
