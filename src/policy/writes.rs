//! The statements that change policies and overrides, one per function, and the shared
//! change marker that every one of those changes bumps first, in the same transaction.
//!
//! Like `sql.rs`, one macro writes them for Postgres and SQLite.

use super::codec::{match_to_column, scope_to_column, window_to_json};
use super::sql::{PostgresPolicyStore, SqlitePolicyStore, POLICY_COLUMNS};
use super::{PolicyStoreError, StoreResult, MAX_POLICIES_PER_ACTION};
use crate::domain::{Override, Policy, PolicyId, Subject};

/// A change in progress: a transaction whose first statement bumped the change marker.
///
/// That first write locks the marker's one row (Postgres) or takes the database's write
/// lock (SQLite) until the transaction ends, so changes made through any instance run one
/// at a time. A rule that counts rows ([`MAX_POLICIES_PER_ACTION`]) therefore sees every
/// change committed before its count, and no other change can land between its count and
/// its write.
pub(super) struct Change<DB: sqlx::Database> {
    /// The transaction the change is written in.
    pub(super) tx: sqlx::Transaction<'static, DB>,
    /// The marker's value once this change commits.
    version: i64,
}

impl<DB: sqlx::Database> Change<DB> {
    /// Undoes the change, marker included, and releases the lock now rather than when the
    /// pool gets round to it.
    pub(super) async fn roll_back(self) -> sqlx::Result<()> {
        self.tx.rollback().await
    }
}

macro_rules! sql_write_statements {
    ($store:ident, $db:ty, $conn:ty) => {
        impl $store {
            /// Opens a transaction and bumps the change marker in it first (see [`Change`]).
            pub(super) async fn begin_change(&self) -> sqlx::Result<Change<$db>> {
                let mut tx = self.pool.begin().await?;
                let version = Self::bump_change_version(&mut tx).await?;
                Ok(Change { tx, version })
            }

            /// Announces the change to the other instances (Postgres) and commits: the write
            /// and its marker land together.
            pub(super) async fn commit_change(change: Change<$db>) -> sqlx::Result<()> {
                let Change { mut tx, version } = change;
                Self::announce_change(&mut tx, version).await?;
                tx.commit().await
            }

            /// [`PolicyStoreError::ActionFull`] if `p`'s action has
            /// [`MAX_POLICIES_PER_ACTION`] policies besides `p`; run inside a [`Change`],
            /// so that no concurrent write can slip between the count and the write.
            pub(super) async fn ensure_room(conn: &mut $conn, p: &Policy) -> StoreResult<()> {
                let others: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM policies WHERE action = $1 AND id <> $2",
                )
                .bind(p.spec.action.as_str())
                .bind(p.id.as_str())
                .fetch_one(conn)
                .await?;
                if others >= MAX_POLICIES_PER_ACTION as i64 {
                    return Err(PolicyStoreError::ActionFull {
                        action: p.spec.action.clone(),
                    });
                }
                Ok(())
            }

            async fn bump_change_version(conn: &mut $conn) -> sqlx::Result<i64> {
                sqlx::query_scalar(
                    "UPDATE policy_changes SET version = version + 1 \
                     WHERE id = 1 RETURNING version",
                )
                .fetch_one(conn)
                .await
            }

            pub(super) async fn insert_policy_row(
                conn: &mut $conn,
                p: &Policy,
            ) -> sqlx::Result<()> {
                let sql = format!(
                    "INSERT INTO policies ({POLICY_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
                );
                sqlx::query(&sql)
                    .bind(p.id.as_str())
                    .bind(p.spec.action.as_str())
                    .bind(p.spec.measure.as_str())
                    .bind(p.spec.unit.as_deref())
                    .bind(p.spec.limit.get() as i64)
                    .bind(window_to_json(
                    &p.spec.window,
                    p.spec.zone_attribute.as_deref(),
                ))
                    .bind(p.spec.mode.as_str())
                    .bind(p.spec.enabled)
                    .bind(p.spec.ledger_denials)
                    .bind(&p.spec.description)
                    .bind(p.created_at)
                    .bind(p.updated_at)
                    .bind(p.version)
                    .bind(scope_to_column(&p.spec.scope))
                    .bind(match_to_column(&p.spec.conditions))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            pub(super) async fn update_policy_row(
                conn: &mut $conn,
                p: &Policy,
                expected_version: i64,
            ) -> sqlx::Result<bool> {
                let done = sqlx::query(
                    "UPDATE policies SET action = $2, measure = $3, unit = $4, limit_value = $5, \
                     window_spec = $6, mode = $7, enabled = $8, ledger_denials = $9, \
                     description = $10, updated_at = $11, version = $12, scope = $14, \
                     match_spec = $15 WHERE id = $1 AND version = $13",
                )
                .bind(p.id.as_str())
                .bind(p.spec.action.as_str())
                .bind(p.spec.measure.as_str())
                .bind(p.spec.unit.as_deref())
                .bind(p.spec.limit.get() as i64)
                .bind(window_to_json(
                    &p.spec.window,
                    p.spec.zone_attribute.as_deref(),
                ))
                .bind(p.spec.mode.as_str())
                .bind(p.spec.enabled)
                .bind(p.spec.ledger_denials)
                .bind(&p.spec.description)
                .bind(p.updated_at)
                .bind(p.version)
                .bind(expected_version)
                .bind(scope_to_column(&p.spec.scope))
                .bind(match_to_column(&p.spec.conditions))
                .execute(conn)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            pub(super) async fn delete_policy_row(
                conn: &mut $conn,
                id: &PolicyId,
                expected_version: i64,
            ) -> sqlx::Result<bool> {
                // Overrides go with it: ON DELETE CASCADE (SQLite: sqlx enables foreign keys).
                let done = sqlx::query("DELETE FROM policies WHERE id = $1 AND version = $2")
                    .bind(id.as_str())
                    .bind(expected_version)
                    .execute(conn)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            pub(super) async fn upsert_override_row(
                conn: &mut $conn,
                o: &Override,
            ) -> sqlx::Result<()> {
                sqlx::query(
                    "INSERT INTO policy_overrides \
                     (policy_id, subject, limit_value, expires_at, note, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (policy_id, subject) DO UPDATE SET \
                     limit_value = excluded.limit_value, expires_at = excluded.expires_at, \
                     note = excluded.note, updated_at = excluded.updated_at",
                )
                .bind(o.policy_id.as_str())
                .bind(o.subject.as_str())
                .bind(o.spec.limit.get() as i64)
                .bind(o.spec.expires_at)
                .bind(o.spec.note.as_deref())
                .bind(o.created_at)
                .bind(o.updated_at)
                .execute(conn)
                .await?;
                Ok(())
            }

            pub(super) async fn delete_override_row(
                conn: &mut $conn,
                policy: &PolicyId,
                subject: &Subject,
            ) -> sqlx::Result<bool> {
                let done = sqlx::query(
                    "DELETE FROM policy_overrides WHERE policy_id = $1 AND subject = $2",
                )
                .bind(policy.as_str())
                .bind(subject.as_str())
                .execute(conn)
                .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}

sql_write_statements!(PostgresPolicyStore, sqlx::Postgres, sqlx::PgConnection);
sql_write_statements!(SqlitePolicyStore, sqlx::Sqlite, sqlx::SqliteConnection);
