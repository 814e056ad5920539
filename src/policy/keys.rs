//! The statements on `api_keys`, generic over the database like the policies' (`sql.rs`).
//!
//! Creating and revoking a key are changes like a policy's: they bump the change marker in
//! their transaction and announce it, so every instance reloads its keys as it reloads its
//! policies. Noting when keys were last used is not a change: it moves no marker.

use super::sql::SqlPolicyStore;
use super::{PolicyStoreError, StoreResult};
use crate::access::{KeyRecord, Operation, Operations};
use crate::db::formats::{self, Gate, Oldest};
use crate::db::{ColumnType, Sql};
use crate::domain::{ActionGlob, CalendarPeriod, Policy, Record, Window};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Encode, Executor, IntoArguments, Row, Type};

/// The columns of `api_keys`, in the order [`SqlPolicyStore::insert_key_row`] binds them.
const KEY_COLUMNS: &str = "id, name, prefix, secret_hash, actions, operations, expires_at, \
     created_at, revoked_at, last_used_at";

fn corrupt(what: &str, error: impl std::fmt::Display) -> PolicyStoreError {
    PolicyStoreError::Corrupt(format!("api_keys.{what}: {error}"))
}

/// The strings of a JSON array column.
fn strings(what: &str, value: &Value) -> StoreResult<Vec<String>> {
    serde_json::from_value(value.clone()).map_err(|e| corrupt(what, e))
}

impl<DB> SqlPolicyStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    String: ColumnType<DB>,
    i64: ColumnType<DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (i64, String): for<'r> sqlx::FromRow<'r, DB::Row>,
    Json<Value>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Option<DateTime<Utc>>: ColumnType<DB>,
{
    /// A row of `api_keys` as a [`KeyRecord`].
    pub(super) fn key_from_row(row: &DB::Row) -> StoreResult<KeyRecord> {
        let Json(actions): Json<Value> = row.try_get("actions")?;
        let Json(operations): Json<Value> = row.try_get("operations")?;
        let actions = strings("actions", &actions)?
            .iter()
            .map(|glob| {
                ActionGlob::parse("actions", glob).map_err(|e| corrupt("actions", e.message))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let operations = strings("operations", &operations)?
            .iter()
            .map(|op| {
                Operation::parse("operations", op).map_err(|e| corrupt("operations", e.message))
            })
            .collect::<StoreResult<Operations>>()?;
        Ok(KeyRecord {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            prefix: row.try_get("prefix")?,
            secret_hash: row.try_get("secret_hash")?,
            actions,
            operations,
            expires_at: row.try_get("expires_at")?,
            created_at: row.try_get("created_at")?,
            revoked_at: row.try_get("revoked_at")?,
            last_used_at: row.try_get("last_used_at")?,
        })
    }

    /// Every key, oldest first.
    pub(super) async fn select_keys(&self) -> StoreResult<Vec<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(Self::key_from_row).collect()
    }

    /// Inserts the row of a new key.
    pub(super) async fn insert_key_row(
        conn: &mut DB::Connection,
        key: &KeyRecord,
    ) -> sqlx::Result<()> {
        let actions: Vec<&str> = key.actions.iter().map(ActionGlob::as_str).collect();
        let operations: Vec<&str> = key.operations.iter().map(Operation::as_str).collect();
        let sql = format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        );
        sqlx::query(&sql)
            .bind(key.id.as_str())
            .bind(key.name.as_str())
            .bind(key.prefix.as_str())
            .bind(key.secret_hash.as_str())
            .bind(Json(Value::from(actions)))
            .bind(Json(Value::from(operations)))
            .bind(key.expires_at)
            .bind(key.created_at)
            .bind(key.revoked_at)
            .bind(key.last_used_at)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The version of the live instance (seen within [`crate::db::formats::LIVE_FOR`] of `now`)
    /// that keeps `gate` closed, if any; read on `conn`, inside the change it guards.
    pub(super) async fn closed_by(
        conn: &mut DB::Connection,
        now: DateTime<Utc>,
        gate: Gate,
    ) -> sqlx::Result<Option<String>> {
        let oldest = formats::oldest_live::<DB>(conn, now).await?;
        Ok(Oldest::blocking(oldest.as_ref(), gate).map(str::to_owned))
    }

    /// [`PolicyStoreError::Outdated`] while an instance still live keeps `gate` closed.
    pub(super) async fn ensure_open(
        conn: &mut DB::Connection,
        now: DateTime<Utc>,
        gate: Gate,
    ) -> StoreResult<()> {
        match Self::closed_by(conn, now, gate).await? {
            Some(version) => Err(PolicyStoreError::Outdated { version }),
            None => Ok(()),
        }
    }

    /// [`PolicyStoreError::Outdated`] when `p` has a shape an instance still live cannot
    /// read ([`Gate::PolicyShapes`]): a calendar window with anchors or a `year` period, a
    /// `request` or `lifetime` window, a `match_not` (which it would ignore, applying the
    /// policy to requests it excludes), or alert thresholds (which it would not report);
    /// or records totals ([`Gate::RecordTotals`]). Run inside a change.
    pub(super) async fn ensure_readable(conn: &mut DB::Connection, p: &Policy) -> StoreResult<()> {
        if p.spec.record == Record::Totals {
            Self::ensure_open(conn, p.updated_at, Gate::RecordTotals).await?;
        }
        let new_window = match p.spec.window {
            Window::Calendar {
                period, anchors, ..
            } => period == CalendarPeriod::Year || !anchors.is_default(),
            Window::Request | Window::Lifetime => true,
            _ => false,
        };
        if !new_window && p.spec.exclusions.is_empty() && p.spec.alert_thresholds.is_empty() {
            return Ok(());
        }
        Self::ensure_open(conn, p.updated_at, Gate::PolicyShapes).await
    }

    /// Sets `revoked_at` of key `id` to `at` unless it is set already; false if no key
    /// changed (unknown, or revoked before).
    pub(super) async fn revoke_key_row(
        conn: &mut DB::Connection,
        id: &str,
        at: DateTime<Utc>,
    ) -> sqlx::Result<bool> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
                .bind(id)
                .bind(at)
                .execute(conn)
                .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// The key `id`, read inside a change.
    pub(super) async fn key_row(
        conn: &mut DB::Connection,
        id: &str,
    ) -> StoreResult<Option<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1");
        let row = sqlx::query(&sql).bind(id).fetch_optional(conn).await?;
        row.as_ref().map(Self::key_from_row).transpose()
    }

    /// Moves `last_used_at` of each key forward to the instant given (never back: another
    /// instance may have written a later one).
    pub(super) async fn note_uses(&self, uses: &[(String, DateTime<Utc>)]) -> StoreResult<()> {
        for (id, at) in uses {
            sqlx::query(
                "UPDATE api_keys SET last_used_at = $2 \
                 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
            )
            .bind(id.as_str())
            .bind(*at)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }
}
