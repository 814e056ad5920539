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
