//! The SQL migrations (`migrations/{postgres,sqlite}`), embedded in the binary.
//!
//! A hand-made [`MigrationSource`] over `include_str!`ed files: `sqlx::migrate!` does the
//! same, but only with sqlx's `macros` feature, which compiles sqlx's whole proc-macro
//! stack (and its database drivers a second time, for the host) into every build.

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// Migrations as `(file name, SQL)`; file names are `<version>_<description>.sql`.
type Files = &'static [(&'static str, &'static str)];

/// Postgres migrations, oldest first.
pub(super) const POSTGRES: Files = &[
    (
        "20261121220000_create_policies.sql",
        include_str!("../../migrations/postgres/20261121220000_create_policies.sql"),
    ),
    (
        "20261121230000_create_ledger_entries.sql",
        include_str!("../../migrations/postgres/20261121230000_create_ledger_entries.sql"),
    ),
    (
        "20261122090000_create_policy_changes.sql",
        include_str!("../../migrations/postgres/20261122090000_create_policy_changes.sql"),
    ),
    (
        "20261201090000_create_counter_snapshots.sql",
        include_str!("../../migrations/postgres/20261201090000_create_counter_snapshots.sql"),
    ),
    (
        "20261215090000_add_budget_columns.sql",
        include_str!("../../migrations/postgres/20261215090000_add_budget_columns.sql"),
    ),
    (
        "20261220090000_add_void_kind.sql",
        include_str!("../../migrations/postgres/20261220090000_add_void_kind.sql"),
    ),
    (
        "20261227090000_readable_ledger_columns.sql",
        include_str!("../../migrations/postgres/20261227090000_readable_ledger_columns.sql"),
    ),
    (
        "20261227100000_create_service_instances.sql",
        include_str!("../../migrations/postgres/20261227100000_create_service_instances.sql"),
    ),
    (
        "20261227110000_index_compact_rows.sql",
        include_str!("../../migrations/postgres/20261227110000_index_compact_rows.sql"),
    ),
    (
        "20261228090000_create_api_keys.sql",
        include_str!("../../migrations/postgres/20261228090000_create_api_keys.sql"),
    ),
    (
        "20261228100000_add_match_not.sql",
        include_str!("../../migrations/postgres/20261228100000_add_match_not.sql"),
    ),
    (
        "20261229090000_add_alert_thresholds.sql",
        include_str!("../../migrations/postgres/20261229090000_add_alert_thresholds.sql"),
    ),
    (
        "20261229100000_create_alert_events.sql",
        include_str!("../../migrations/postgres/20261229100000_create_alert_events.sql"),
    ),
    (
        "20261229110000_create_webhooks.sql",
        include_str!("../../migrations/postgres/20261229110000_create_webhooks.sql"),
    ),
    (
        "20261230090000_create_ledger_hourly.sql",
        include_str!("../../migrations/postgres/20261230090000_create_ledger_hourly.sql"),
    ),
    (
        "20261230100000_index_ledger_kinds.sql",
        include_str!("../../migrations/postgres/20261230100000_index_ledger_kinds.sql"),
    ),
    (
        "20261231090000_create_redis_generations.sql",
        include_str!("../../migrations/postgres/20261231090000_create_redis_generations.sql"),
    ),
    (
        "20270105090000_create_counter_snapshot_deltas.sql",
        include_str!("../../migrations/postgres/20270105090000_create_counter_snapshot_deltas.sql"),
    ),
    (
        "20270110090000_create_ledger_totals.sql",
        include_str!("../../migrations/postgres/20270110090000_create_ledger_totals.sql"),
    ),
    (
        "20270110100000_add_record_level.sql",
        include_str!("../../migrations/postgres/20270110100000_add_record_level.sql"),
    ),
    (
        "20270120090000_fold_totals.sql",
        include_str!("../../migrations/postgres/20270120090000_fold_totals.sql"),
    ),
];

/// SQLite migrations, oldest first.
pub(super) const SQLITE: Files = &[
    (
        "20261121220000_create_policies.sql",
        include_str!("../../migrations/sqlite/20261121220000_create_policies.sql"),
    ),
    (
        "20261121230000_create_ledger_entries.sql",
        include_str!("../../migrations/sqlite/20261121230000_create_ledger_entries.sql"),
    ),
    (
        "20261122090000_create_policy_changes.sql",
        include_str!("../../migrations/sqlite/20261122090000_create_policy_changes.sql"),
    ),
    (
        "20261201090000_create_counter_snapshots.sql",
        include_str!("../../migrations/sqlite/20261201090000_create_counter_snapshots.sql"),
    ),
    (
        "20261215090000_add_budget_columns.sql",
        include_str!("../../migrations/sqlite/20261215090000_add_budget_columns.sql"),
    ),
    (
        "20261220090000_add_void_kind.sql",
        include_str!("../../migrations/sqlite/20261220090000_add_void_kind.sql"),
    ),
    (
        "20261227090000_readable_ledger_columns.sql",
        include_str!("../../migrations/sqlite/20261227090000_readable_ledger_columns.sql"),
    ),
    (
        "20261227100000_create_service_instances.sql",
        include_str!("../../migrations/sqlite/20261227100000_create_service_instances.sql"),
    ),
    (
        "20261227110000_index_compact_rows.sql",
        include_str!("../../migrations/sqlite/20261227110000_index_compact_rows.sql"),
    ),
    (
        "20261228090000_create_api_keys.sql",
        include_str!("../../migrations/sqlite/20261228090000_create_api_keys.sql"),
    ),
    (
        "20261228100000_add_match_not.sql",
        include_str!("../../migrations/sqlite/20261228100000_add_match_not.sql"),
    ),
    (
        "20261229090000_add_alert_thresholds.sql",
        include_str!("../../migrations/sqlite/20261229090000_add_alert_thresholds.sql"),
    ),
    (
        "20261229100000_create_alert_events.sql",
        include_str!("../../migrations/sqlite/20261229100000_create_alert_events.sql"),
    ),
    (
        "20261229110000_create_webhooks.sql",
        include_str!("../../migrations/sqlite/20261229110000_create_webhooks.sql"),
    ),
    (
        "20261230090000_create_ledger_hourly.sql",
        include_str!("../../migrations/sqlite/20261230090000_create_ledger_hourly.sql"),
    ),
    (
        "20261230100000_index_ledger_kinds.sql",
        include_str!("../../migrations/sqlite/20261230100000_index_ledger_kinds.sql"),
    ),
    (
        "20261231090000_create_redis_generations.sql",
        include_str!("../../migrations/sqlite/20261231090000_create_redis_generations.sql"),
    ),
    (
        "20270105090000_create_counter_snapshot_deltas.sql",
        include_str!("../../migrations/sqlite/20270105090000_create_counter_snapshot_deltas.sql"),
    ),
    (
        "20270110090000_create_ledger_totals.sql",
        include_str!("../../migrations/sqlite/20270110090000_create_ledger_totals.sql"),
    ),
    (
        "20270110100000_add_record_level.sql",
        include_str!("../../migrations/sqlite/20270110100000_add_record_level.sql"),
    ),
    (
        "20270120090000_fold_totals.sql",
        include_str!("../../migrations/sqlite/20270120090000_fold_totals.sql"),
    ),
];

/// A [`MigrationSource`] over embedded files, so no migration directory is needed at run time.
#[derive(Debug)]
struct Embedded(Files);

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 'static>> {
        Box::pin(async move {
            let mut migrations = Vec::with_capacity(self.0.len());
            for (name, sql) in self.0 {
                let (version, description) = name
                    .trim_end_matches(".sql")
                    .split_once('_')
                    .ok_or_else(|| format!("migration {name} lacks a version prefix"))?;
                migrations.push(Migration::new(
                    version.parse()?,
                    Cow::Owned(description.replace('_', " ")),
                    MigrationType::Simple,
                    Cow::Borrowed(sql),
                    false,
                ));
            }
            Ok(migrations)
        })
    }
}

/// The migrator for one set of embedded files.
pub(super) async fn migrator(files: Files) -> Result<Migrator, sqlx::migrate::MigrateError> {
    Migrator::new(Embedded(files)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Connection, SqliteConnection};

    /// The migration that adds the `void` kind copies SQLite's ledger into a new table: every
    /// row and `seq` stays, and the next `seq` is never one retention already gave away.
    #[tokio::test]
    async fn adding_the_void_kind_keeps_every_entry_and_the_sequence_of_sqlite() {
        let mut conn = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("works in memory");
        let before_void = SQLITE
            .iter()
            .position(|(name, _)| name.ends_with("add_void_kind.sql"))
            .expect("the migration that adds the void kind");
        migrator(&SQLITE[..before_void])
            .await
            .expect("works in memory")
            .run(&mut conn)
            .await
            .expect("works in memory");
        let insert = "INSERT INTO ledger_entries (id, at, kind, action, subject, amount) \
                      VALUES ($1, '2026-11-27T10:00:00+00:00', 'charge', 'sms', 'u', 1)";
        for id in ["a", "b", "c"] {
            sqlx::query(insert)
                .bind(id)
                .execute(&mut conn)
                .await
                .expect("works in memory");
        }
        // Retention deleted the newest: seq 3 was given once and must never be again.
        sqlx::query("DELETE FROM ledger_entries WHERE id = 'c'")
            .execute(&mut conn)
            .await
            .expect("works in memory");
        let refused = sqlx::query(insert.replace("'charge'", "'void'").as_str())
            .bind("v0")
            .execute(&mut conn)
            .await;
        assert!(refused.is_err(), "no void kind before the migration");

        migrator(&SQLITE[..=before_void])
            .await
            .expect("works in memory")
            .run(&mut conn)
            .await
            .expect("works in memory");
        sqlx::query(insert.replace("'charge'", "'void'").as_str())
            .bind("v")
            .execute(&mut conn)
            .await
            .expect("works in memory");
        let rows: Vec<(i64, String, String)> =
            sqlx::query_as("SELECT seq, id, kind FROM ledger_entries ORDER BY seq")
                .fetch_all(&mut conn)
                .await
                .expect("works in memory");
        let expected = [(1, "a", "charge"), (2, "b", "charge"), (4, "v", "void")]
            .map(|(seq, id, kind)| (seq, id.to_owned(), kind.to_owned()));
        assert_eq!(rows, expected);
        let indexes: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'ledger_entries' AND name LIKE 'ledger_entries_%_idx'",
        )
        .fetch_one(&mut conn)
        .await
        .expect("works in memory");
        assert_eq!(indexes, 5, "every index is made again");
    }

    /// The migration that adds the hourly rollups counts the entries already there, and
    /// from then on every insert counts its own (a recorded denial in both rollups).
    #[tokio::test]
    async fn the_rollups_count_the_entries_written_before_and_after_on_sqlite() {
        let mut conn = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("works in memory");
        let before = SQLITE
            .iter()
            .position(|(name, _)| name.ends_with("create_ledger_hourly.sql"))
            .expect("the migration that adds the rollups");
        let insert = "INSERT INTO ledger_entries (id, at, kind, action, subject, amount) \
                      VALUES ($1, $2, $3, 'sms', $4, $5)";
        let rows = [
            ("a", "2026-11-27T10:00:00+00:00", "charge", "u", 1),
            ("b", "2026-11-27T10:59:59.999+00:00", "hold", "u", 4),
            ("c", "2026-11-27T10:30:00+00:00", "deny", "v", 1),
            ("d", "2026-11-27T10:31:00+00:00", "refund", "u", 1),
            ("e", "2026-11-27T11:00:00+00:00", "charge", "v", 2),
        ];
        let hour = 1_795_773_600 / 3_600; // 2026-11-27T10:00:00Z
        migrator(&SQLITE[..before])
            .await
            .expect("works in memory")
            .run(&mut conn)
            .await
            .expect("works in memory");
        for (i, (id, at, kind, subject, amount)) in rows.iter().enumerate() {
            if i == 4 {
                migrator(SQLITE)
                    .await
                    .expect("works in memory")
                    .run(&mut conn)
                    .await
                    .expect("works in memory");
            }
            sqlx::query(insert)
                .bind(id)
                .bind(at)
                .bind(kind)
                .bind(subject)
                .bind(amount)
                .execute(&mut conn)
                .await
                .expect("works in memory");
        }
        let hourly: Vec<(i64, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT hour, action, charges, amount, denials FROM ledger_hourly ORDER BY hour",
        )
        .fetch_all(&mut conn)
        .await
        .expect("works in memory");
        let sms =
            |hour, charges, amount, denials| (hour, "sms".to_owned(), charges, amount, denials);
        assert_eq!(hourly, [sms(hour, 2, 5, 1), sms(hour + 1, 1, 2, 0)]);
        let denials: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT hour, subject, denials FROM ledger_hourly_denials")
                .fetch_all(&mut conn)
                .await
                .expect("works in memory");
        assert_eq!(denials, [(hour, "v".to_owned(), 1)]);
    }
}
