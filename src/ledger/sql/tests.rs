use super::*;

/// A fresh, migrated SQLite database in a file of its own, and that file (remove it
/// when done).
pub(in crate::ledger) async fn fresh_sqlite() -> (sqlx::SqlitePool, std::path::PathBuf) {
    let file = std::env::temp_dir().join(format!(
        "quota-ledger-test-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite://{}", file.display());
    crate::db::migrate_url(&url).await.expect("migrating");
    let crate::db::Pool::Sqlite(pool) = crate::db::open(&url, 1).await.expect("opening") else {
        panic!("a SQLite URL opens a SQLite pool");
    };
    (pool, file)
}

/// Fails unless SQLite's plan for `sql` has a step that searches as `search` says
/// (`"<table> USING <index> (<terms>)"`), and none that scans a whole table (the plan
/// does not depend on the parameters, left unbound).
pub(in crate::ledger) async fn assert_searches(pool: &sqlx::SqlitePool, sql: &str, search: &str) {
    let plan: Vec<String> = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
        .fetch_all(pool)
        .await
        .expect("explaining")
        .iter()
        .map(|row| row.get::<String, _>("detail"))
        .collect();
    assert!(
        plan.iter()
            .any(|step| step.contains(&format!("SEARCH {search}"))),
        "{sql}: {plan:?}"
    );
    assert!(
        !plan.iter().any(|step| step.starts_with("SCAN ")),
        "{sql}: {plan:?}"
    );
}

/// Retention must find its rows through the `at` index, never by scanning the table.
#[tokio::test]
async fn retention_searches_the_at_index_on_sqlite() {
    let (pool, file) = fresh_sqlite().await;
    assert_searches(
        &pool,
        RETENTION_DELETE,
        "ledger_entries USING COVERING INDEX ledger_entries_at_idx (at<?)",
    )
    .await;
    pool.close().await;
    let _ = std::fs::remove_file(&file);
}
