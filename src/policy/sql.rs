//! The SQL policy stores: Postgres in production, SQLite as the embedded default.
//!
//! Both speak the same SQL (numbered `$n` parameters, `ON CONFLICT` upserts), so one
//! macro writes both implementations; only the pool type and the way a
//! change is announced (`notify.rs`) differ. Every write bumps the one-row
//! `policy_changes` marker first, in its own transaction, so other instances can see it
//! and writes run one at a time (`writes.rs`).

use super::codec::{match_from_column, scope_from_column, window_from_json};
use super::{ChangeFeed, PolicyStore, PolicyStoreError, StoreResult};
use crate::domain::{
    Action, Measure, Mode, Override, OverrideSpec, Policy, PolicyId, PolicySpec, Quantity, Subject,
};
use async_trait::async_trait;
use sqlx::Row;
use std::sync::Arc;

/// Policies in Postgres.
#[derive(Debug, Clone)]
pub(crate) struct PostgresPolicyStore {
    /// The connection pool (shared with other Postgres users of this process).
    pub(crate) pool: sqlx::PgPool,
}

/// Policies in a local SQLite file.
#[derive(Debug, Clone)]
pub(crate) struct SqlitePolicyStore {
    /// The connection pool.
    pub(crate) pool: sqlx::SqlitePool,
}

/// Opens the store that `database_url` names: `postgres://…` or `sqlite://…`.
pub(crate) async fn connect(database_url: &str) -> anyhow::Result<Arc<dyn PolicyStore>> {
    Ok(match crate::db::open(database_url, 16).await? {
        crate::db::Pool::Postgres(pool) => Arc::new(PostgresPolicyStore { pool }),
        crate::db::Pool::Sqlite(pool) => Arc::new(SqlitePolicyStore { pool }),
    })
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> PolicyStoreError {
    PolicyStoreError::Corrupt(format!("{what}: {error}"))
}

fn quantity(value: i64) -> StoreResult<Quantity> {
    Quantity::parse("limit_value", i128::from(value)).map_err(|e| corrupt("limit_value", e.message))
}

pub(super) const POLICY_COLUMNS: &str =
    "id, action, measure, unit, limit_value, window_spec, mode, enabled, \
     ledger_denials, description, created_at, updated_at, version, scope, match_spec";
const OVERRIDE_COLUMNS: &str =
    "policy_id, subject, limit_value, expires_at, note, created_at, updated_at";

macro_rules! sql_policy_store {
    ($store:ident, $row:ty, $system:literal) => {
        impl $store {
            fn policy_from_row(row: &$row) -> StoreResult<Policy> {
                let text = |name: &str| -> StoreResult<String> { Ok(row.try_get(name)?) };
                let (window, zone_attribute) = window_from_json(&text("window_spec")?)?;
                let limit = quantity(row.try_get("limit_value")?)?;
                window
                    .check_limit("limit", limit.get())
                    .map_err(|e| corrupt("limit_value", e.message))?;
                Ok(Policy {
                    id: PolicyId::parse("id", &text("id")?)
                        .map_err(|e| corrupt("id", e.message))?,
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
                        scope: scope_from_column(
                            row.try_get::<Option<String>, _>("scope")?.as_deref(),
                        )?,
                        conditions: match_from_column(
                            row.try_get::<Option<String>, _>("match_spec")?.as_deref(),
                        )?,
                        zone_attribute,
                    },
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                    version: row.try_get("version")?,
                })
            }

            fn override_from_row(row: &$row) -> StoreResult<Override> {
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
        impl PolicyStore for $store {
            async fn ping(&self) -> StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy list_policies", otel.kind = "client", db.system = $system))]

            async fn list_policies(&self) -> StoreResult<Vec<Policy>> {
                let sql = format!("SELECT {POLICY_COLUMNS} FROM policies ORDER BY id");
                let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                rows.iter().map(Self::policy_from_row).collect()
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy get_policy", otel.kind = "client", db.system = $system))]

            async fn get_policy(&self, id: &PolicyId) -> StoreResult<Option<Policy>> {
                let sql = format!("SELECT {POLICY_COLUMNS} FROM policies WHERE id = $1");
                let row = sqlx::query(&sql)
                    .bind(id.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
                row.as_ref().map(Self::policy_from_row).transpose()
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy insert_policy", otel.kind = "client", db.system = $system))]

            async fn insert_policy(&self, p: &Policy) -> StoreResult<()> {
                let mut change = self.begin_change().await?;
                if let Err(error) = Self::ensure_room(&mut change.tx, p).await {
                    change.roll_back().await?;
                    return Err(error);
                }
                Self::insert_policy_row(&mut change.tx, p).await?;
                Self::commit_change(change).await?;
                Ok(())
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy update_policy", otel.kind = "client", db.system = $system))]

            async fn update_policy(&self, p: &Policy, expected_version: i64) -> StoreResult<bool> {
                let mut change = self.begin_change().await?;
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

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy delete_policy", otel.kind = "client", db.system = $system))]

            async fn delete_policy(
                &self,
                id: &PolicyId,
                expected_version: i64,
            ) -> StoreResult<bool> {
                let mut change = self.begin_change().await?;
                if !Self::delete_policy_row(&mut change.tx, id, expected_version).await? {
                    change.roll_back().await?;
                    return Ok(false);
                }
                Self::commit_change(change).await?;
                Ok(true)
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy list_overrides", otel.kind = "client", db.system = $system))]

            async fn list_overrides(
                &self,
                policy: Option<&PolicyId>,
            ) -> StoreResult<Vec<Override>> {
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

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy get_override", otel.kind = "client", db.system = $system))]

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

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy upsert_override", otel.kind = "client", db.system = $system))]

            async fn upsert_override(&self, o: &Override) -> StoreResult<()> {
                let mut change = self.begin_change().await?;
                Self::upsert_override_row(&mut change.tx, o).await?;
                Self::commit_change(change).await?;
                Ok(())
            }

            #[tracing::instrument(level = "trace", name = "sql", skip_all, fields(otel.name = "sql policy delete_override", otel.kind = "client", db.system = $system))]

            async fn delete_override(
                &self,
                policy: &PolicyId,
                subject: &Subject,
            ) -> StoreResult<bool> {
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
                Ok(sqlx::query_scalar(sql).fetch_one(&self.pool).await?)
            }

            async fn subscribe(&self) -> StoreResult<Option<ChangeFeed>> {
                self.subscribe_to_changes().await
            }
        }
    };
}

sql_policy_store!(PostgresPolicyStore, sqlx::postgres::PgRow, "postgresql");
sql_policy_store!(SqlitePolicyStore, sqlx::sqlite::SqliteRow, "sqlite");
