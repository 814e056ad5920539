//! The statements that change policies and overrides, one per function, and the shared
//! change marker that every one of those changes bumps first, in the same transaction.
//!
//! Like `sql.rs`, they are written once, generic over the database (Postgres or SQLite).

use super::codec::{match_to_column, scope_to_column, window_to_json};
use super::notify::Announce;
use super::sql::{SqlPolicyStore, POLICY_COLUMNS};
use super::{PolicyStoreError, StoreResult, MAX_POLICIES_PER_ACTION};
use crate::db::ColumnType;
use crate::domain::{Override, Policy, PolicyId, Subject};
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Encode, Executor, IntoArguments, Type};

/// A statement of `DB` with the parameters bound so far.
type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>;

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

impl<DB> SqlPolicyStore<DB>
where
    DB: Announce,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    bool: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Option<DateTime<Utc>>: ColumnType<DB>,
{
    /// Opens a transaction and bumps the change marker in it first (see [`Change`]).
    pub(super) async fn begin_change(&self) -> sqlx::Result<Change<DB>> {
        let mut tx = self.pool.begin().await?;
        let version = Self::bump_change_version(&mut tx).await?;
        Ok(Change { tx, version })
    }

    /// Announces the change to the other instances (Postgres) and commits: the write and
    /// its marker land together.
    pub(super) async fn commit_change(change: Change<DB>) -> sqlx::Result<()> {
        let Change { mut tx, version } = change;
        DB::announce_change(&mut tx, version).await?;
        tx.commit().await
    }

    /// [`PolicyStoreError::ActionFull`] if `p`'s action has [`MAX_POLICIES_PER_ACTION`]
    /// policies besides `p`; run inside a [`Change`], so that no concurrent write can slip
    /// between the count and the write.
    pub(super) async fn ensure_room(conn: &mut DB::Connection, p: &Policy) -> StoreResult<()> {
        let others: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM policies WHERE action = $1 AND id <> $2")
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

    /// Moves the change marker on; returns its new value.
    async fn bump_change_version(conn: &mut DB::Connection) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "UPDATE policy_changes SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(conn)
        .await
    }

    /// Binds `p`'s columns to `query`: `$1` to `$10` and `$14` to `$18`, which the insert
    /// and the update share, and between them (`$11` to `$13`) what `stamps` binds.
    fn bind_policy<'q>(
        query: Query<'q, DB>,
        p: &'q Policy,
        stamps: impl FnOnce(Query<'q, DB>) -> Query<'q, DB>,
    ) -> Query<'q, DB> {
        let query = query
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
            .bind(&p.spec.description);
        stamps(query)
            .bind(scope_to_column(&p.spec.scope))
            .bind(match_to_column(&p.spec.conditions))
            .bind(match_to_column(&p.spec.exclusions))
            .bind(super::sql::thresholds_to_column(&p.spec.alert_thresholds))
            .bind(p.spec.record.as_str())
    }

    /// Inserts the row of a new policy.
    pub(super) async fn insert_policy_row(
        conn: &mut DB::Connection,
        p: &Policy,
    ) -> sqlx::Result<()> {
        let sql = format!(
            "INSERT INTO policies ({POLICY_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18)"
        );
        Self::bind_policy(sqlx::query(&sql), p, |query| {
            query.bind(p.created_at).bind(p.updated_at).bind(p.version)
        })
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Replaces the row of policy `p` if its version is still `expected_version`; false if
    /// it is not (or the row is gone).
    pub(super) async fn update_policy_row(
        conn: &mut DB::Connection,
        p: &Policy,
        expected_version: i64,
    ) -> sqlx::Result<bool> {
        let sql = "UPDATE policies SET action = $2, measure = $3, unit = $4, limit_value = $5, \
             window_spec = $6, mode = $7, enabled = $8, ledger_denials = $9, \
             description = $10, updated_at = $11, version = $12, scope = $14, \
             match_spec = $15, match_not_spec = $16, alert_thresholds = $17, \
             record_level = $18 \
             WHERE id = $1 AND version = $13";
        let done = Self::bind_policy(sqlx::query(sql), p, |query| {
            query
                .bind(p.updated_at)
                .bind(p.version)
                .bind(expected_version)
        })
        .execute(conn)
        .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// Deletes policy `id` if its version is still `expected_version`; false otherwise.
    pub(super) async fn delete_policy_row(
        conn: &mut DB::Connection,
        id: &PolicyId,
        expected_version: i64,
    ) -> sqlx::Result<bool> {
        // Overrides go with it: ON DELETE CASCADE (SQLite: sqlx enables foreign keys).
        let done = sqlx::query("DELETE FROM policies WHERE id = $1 AND version = $2")
            .bind(id.as_str())
            .bind(expected_version)
            .execute(conn)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// Inserts override `o`, or replaces the one of the same policy and subject (keeping
    /// its `created_at`).
    pub(super) async fn upsert_override_row(
        conn: &mut DB::Connection,
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

    /// Deletes the override of `policy` for `subject`; false if there was none.
    pub(super) async fn delete_override_row(
        conn: &mut DB::Connection,
        policy: &PolicyId,
        subject: &Subject,
    ) -> sqlx::Result<bool> {
        let done =
            sqlx::query("DELETE FROM policy_overrides WHERE policy_id = $1 AND subject = $2")
                .bind(policy.as_str())
                .bind(subject.as_str())
                .execute(conn)
                .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
