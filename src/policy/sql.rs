//! The SQL policy stores: Postgres in production, SQLite as the embedded default.
//!
//! Both speak the same SQL (numbered `$n` parameters, `ON CONFLICT` upserts), so one
//! [`SqlPolicyStore`], generic over the database, serves both; only the pool type and the
//! way a change is announced (`notify.rs`) differ. Every write bumps the one-row
//! `policy_changes` marker first, in its own transaction, so other instances can see it
//! and writes run one at a time (`writes.rs`).

use super::codec::{match_from_column, scope_from_column, window_from_json};
use super::notify::Announce;
use super::{ChangeFeed, Gate, PolicyStore, PolicyStoreError, StoreResult};
use crate::access::KeyRecord;
use crate::db::ColumnType;
use crate::domain::{
    Action, Measure, Mode, Override, OverrideSpec, Policy, PolicyId, PolicySpec, Quantity, Record,
    Subject,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{ColumnIndex, Database, Encode, Executor, IntoArguments, Row, Type};
use std::sync::Arc;

/// Policies in Postgres (production) or in a local SQLite file (the embedded default).
#[derive(Debug)]
pub(crate) struct SqlPolicyStore<DB: Database> {
    /// The connection pool (Postgres: shared with other Postgres users of this process).
    pub(crate) pool: sqlx::Pool<DB>,
}

/// Opens the store that `database_url` names: `postgres://…` or `sqlite://…`.
pub(crate) async fn connect(database_url: &str) -> anyhow::Result<Arc<dyn PolicyStore>> {
    Ok(match crate::db::open(database_url, 16).await? {
        crate::db::Pool::Postgres(pool) => Arc::new(SqlPolicyStore { pool }),
        crate::db::Pool::Sqlite(pool) => Arc::new(SqlPolicyStore { pool }),
    })
}

/// A row that no longer parses: which column, and why.
fn corrupt(what: &str, error: impl std::fmt::Display) -> PolicyStoreError {
    PolicyStoreError::Corrupt(format!("{what}: {error}"))
}

/// Stored alert thresholds (`"50,80,100"`; NULL for none).
fn thresholds_from_column(text: Option<&str>) -> StoreResult<crate::domain::Thresholds> {
    let percents = text
        .unwrap_or("")
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<i64>().map_err(|e| corrupt("alert_thresholds", e)))
        .collect::<StoreResult<Vec<i64>>>()?;
    crate::domain::Thresholds::parse("alert_thresholds", &percents)
        .map_err(|e| corrupt("alert_thresholds", e.message))
}

/// Alert thresholds as stored: ascending, comma-separated; NULL for none.
pub(super) fn thresholds_to_column(thresholds: &crate::domain::Thresholds) -> Option<String> {
    let percents: Vec<String> = thresholds.percents().iter().map(u8::to_string).collect();
    (!percents.is_empty()).then(|| percents.join(","))
}

/// A stored limit as a [`Quantity`].
fn quantity(value: i64) -> StoreResult<Quantity> {
    Quantity::parse("limit_value", i128::from(value)).map_err(|e| corrupt("limit_value", e.message))
}

/// The columns of `policies`, in the order `insert_policy_row` binds them.
pub(super) const POLICY_COLUMNS: &str =
    "id, action, measure, unit, limit_value, window_spec, mode, enabled, \
     ledger_denials, description, created_at, updated_at, version, scope, match_spec, \
     match_not_spec, alert_thresholds, record_level";
/// The columns of `policy_overrides` that the reads select.
const OVERRIDE_COLUMNS: &str =
    "policy_id, subject, limit_value, expires_at, note, created_at, updated_at";

impl<DB> SqlPolicyStore<DB>
where
    DB: Announce,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    bool: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Option<DateTime<Utc>>: ColumnType<DB>,
{
    /// A row of `policies` (its [`POLICY_COLUMNS`]) as a [`Policy`].
    fn policy_from_row(row: &DB::Row) -> StoreResult<Policy> {
        let text = |name: &str| -> StoreResult<String> { Ok(row.try_get(name)?) };
        let (window, zone_attribute) = window_from_json(&text("window_spec")?)?;
        let limit = quantity(row.try_get("limit_value")?)?;
        window
            .check_limit("limit", limit.get())
            .map_err(|e| corrupt("limit_value", e.message))?;
        Ok(Policy {
            id: PolicyId::parse("id", &text("id")?).map_err(|e| corrupt("id", e.message))?,
            spec: PolicySpec {
                action: Action::parse("action", &text("action")?)
                    .map_err(|e| corrupt("action", e.message))?,
                measure: Measure::parse("measure", &text("measure")?)
                    .map_err(|e| corrupt("measure", e.message))?,
                unit: row.try_get("unit")?,
                limit,
                window,
                mode: Mode::parse("mode", &text("mode")?)
                    .map_err(|e| corrupt("mode", e.message))?,
                enabled: row.try_get("enabled")?,
                ledger_denials: row.try_get("ledger_denials")?,
                description: text("description")?,
                scope: scope_from_column(row.try_get::<Option<String>, _>("scope")?.as_deref())?,
                conditions: match_from_column(
                    row.try_get::<Option<String>, _>("match_spec")?.as_deref(),
                )?,
                exclusions: match_from_column(
                    row.try_get::<Option<String>, _>("match_not_spec")?
                        .as_deref(),
                )?,
                zone_attribute,
                alert_thresholds: thresholds_from_column(
                    row.try_get::<Option<String>, _>("alert_thresholds")?
                        .as_deref(),
                )?,
                record: Record::parse("record_level", &text("record_level")?)
                    .map_err(|e| corrupt("record_level", e.message))?,
            },
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            version: row.try_get("version")?,
        })
    }

    /// A row of `policy_overrides` (its [`OVERRIDE_COLUMNS`]) as an [`Override`].
    fn override_from_row(row: &DB::Row) -> StoreResult<Override> {
        let policy_id: String = row.try_get("policy_id")?;
        let subject: String = row.try_get("subject")?;
        Ok(Override {
            policy_id: PolicyId::parse("policy_id", &policy_id)
                .map_err(|e| corrupt("policy_id", e.message))?,
            subject: Subject::parse("subject", &subject)
                .map_err(|e| corrupt("subject", e.message))?,
            spec: OverrideSpec {
                limit: quantity(row.try_get("limit_value")?)?,
                expires_at: row.try_get("expires_at")?,
                note: row.try_get("note")?,
            },
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

#[async_trait]
impl<DB> PolicyStore for SqlPolicyStore<DB>
where
    DB: Announce,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    bool: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Option<DateTime<Utc>>: ColumnType<DB>,
    Json<Value>: ColumnType<DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (i64, String): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy list_policies", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn list_policies(&self) -> StoreResult<Vec<Policy>> {
        let sql = format!("SELECT {POLICY_COLUMNS} FROM policies ORDER BY id");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(Self::policy_from_row).collect()
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy get_policy", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn get_policy(&self, id: &PolicyId) -> StoreResult<Option<Policy>> {
        let sql = format!("SELECT {POLICY_COLUMNS} FROM policies WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(Self::policy_from_row).transpose()
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy insert_policy", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn insert_policy(&self, p: &Policy) -> StoreResult<()> {
        let mut change = self.begin_change().await?;
        if let Err(error) = Self::ensure_readable(&mut change.tx, p).await {
            change.roll_back().await?;
            return Err(error);
        }
        if let Err(error) = Self::ensure_room(&mut change.tx, p).await {
            change.roll_back().await?;
            return Err(error);
        }
        Self::insert_policy_row(&mut change.tx, p).await?;
        Self::commit_change(change).await?;
        Ok(())
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy update_policy", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn update_policy(&self, p: &Policy, expected_version: i64) -> StoreResult<bool> {
        let mut change = self.begin_change().await?;
        if let Err(error) = Self::ensure_readable(&mut change.tx, p).await {
            change.roll_back().await?;
            return Err(error);
        }
        if !Self::update_policy_row(&mut change.tx, p, expected_version).await? {
            change.roll_back().await?; // nothing changed, the marker neither
            return Ok(false);
        }
        if let Err(error) = Self::ensure_room(&mut change.tx, p).await {
            change.roll_back().await?;
            return Err(error);
        }
        Self::commit_change(change).await?;
        Ok(true)
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy delete_policy", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn delete_policy(&self, id: &PolicyId, expected_version: i64) -> StoreResult<bool> {
        let mut change = self.begin_change().await?;
        if !Self::delete_policy_row(&mut change.tx, id, expected_version).await? {
            change.roll_back().await?;
            return Ok(false);
        }
        Self::commit_change(change).await?;
        Ok(true)
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy list_overrides", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn list_overrides(&self, policy: Option<&PolicyId>) -> StoreResult<Vec<Override>> {
        let sql = format!(
            "SELECT {OVERRIDE_COLUMNS} FROM policy_overrides \
             WHERE $1 IS NULL OR policy_id = $1 ORDER BY policy_id, subject"
        );
        let rows = sqlx::query(&sql)
            .bind(policy.map(PolicyId::as_str))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::override_from_row).collect()
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy get_override", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn get_override(
        &self,
        policy: &PolicyId,
        subject: &Subject,
    ) -> StoreResult<Option<Override>> {
        let sql = format!(
            "SELECT {OVERRIDE_COLUMNS} FROM policy_overrides \
             WHERE policy_id = $1 AND subject = $2"
        );
        let row = sqlx::query(&sql)
            .bind(policy.as_str())
            .bind(subject.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(Self::override_from_row).transpose()
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy upsert_override", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn upsert_override(&self, o: &Override) -> StoreResult<()> {
        let mut change = self.begin_change().await?;
        Self::upsert_override_row(&mut change.tx, o).await?;
        Self::commit_change(change).await?;
        Ok(())
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy delete_override", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn delete_override(&self, policy: &PolicyId, subject: &Subject) -> StoreResult<bool> {
        let mut change = self.begin_change().await?;
        if !Self::delete_override_row(&mut change.tx, policy, subject).await? {
            change.roll_back().await?;
            return Ok(false);
        }
        Self::commit_change(change).await?;
        Ok(true)
    }

    async fn change_version(&self) -> StoreResult<i64> {
        let sql = "SELECT version FROM policy_changes WHERE id = 1";
        Ok(sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn subscribe(&self) -> StoreResult<Option<ChangeFeed>> {
        DB::subscribe_to_changes(&self.pool).await
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy list_keys", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn list_keys(&self) -> StoreResult<Vec<KeyRecord>> {
        self.select_keys().await
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy insert_key", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn insert_key(&self, key: &KeyRecord) -> StoreResult<()> {
        let mut change = self.begin_change().await?;
        if let Err(error) = Self::ensure_open(&mut change.tx, key.created_at, Gate::ApiKeys).await {
            change.roll_back().await?;
            return Err(error);
        }
        Self::insert_key_row(&mut change.tx, key).await?;
        Self::commit_change(change).await?;
        Ok(())
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy ensure_open", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn ensure_open(&self, gate: Gate, now: DateTime<Utc>) -> StoreResult<()> {
        Self::ensure_open(&mut *self.pool.acquire().await?, now, gate).await
    }

    #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy revoke_key", otel.kind = "client", db.system = DB::DIALECT.system()))]
    async fn revoke_key(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<(KeyRecord, bool)>> {
        let mut change = self.begin_change().await?;
        if !Self::revoke_key_row(&mut change.tx, id, at).await? {
            // Unknown, or revoked before: nothing changed, the marker neither.
            let key = Self::key_row(&mut change.tx, id).await?;
            change.roll_back().await?;
            return Ok(key.map(|key| (key, false)));
        }
        let key = Self::key_row(&mut change.tx, id).await?;
        Self::commit_change(change).await?;
        Ok(key.map(|key| (key, true)))
    }

    async fn note_key_uses(&self, uses: &[(String, DateTime<Utc>)]) -> StoreResult<()> {
        self.note_uses(uses).await
    }
}
