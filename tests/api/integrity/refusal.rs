//! A ledger database that refuses every new entry, as a full disk or a read-only database
//! does: a trigger that aborts each insert into `ledger_entries`, dropped again by `lift`.
//! The service meets the refusal over its real connections, as it would meet the fault.

use sqlx::Connection;

/// The refusal in force on one database.
pub struct Refusal {
    url: String,
}

const SQLITE_REFUSE: &str = "CREATE TRIGGER quota_test_refuse BEFORE INSERT ON ledger_entries \
     BEGIN SELECT RAISE(ABORT, 'injected fault: the ledger refuses writes'); END";
const PG_FUNCTION: &str = "CREATE OR REPLACE FUNCTION quota_test_refuse() RETURNS trigger \
     LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected fault: the ledger refuses writes'; END $$";
/// On Postgres the trigger is created and dropped on the partitioned table, which
/// recurses to each partition; taking the table first, in a transaction, locks them in
/// the order an insert does (the table, then the partition it routes to). Dropped
/// without it, a trigger's clone on a partition was locked first, and an insert waiting
/// there deadlocked with it.
const PG_LOCK: [&str; 2] = [
    "BEGIN",
    "LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE",
];
const PG_REFUSE: &str = "CREATE TRIGGER quota_test_refuse BEFORE INSERT ON ledger_entries \
     FOR EACH ROW EXECUTE FUNCTION quota_test_refuse()";

impl Refusal {
    /// Makes the ledger at `url` refuse every insert from now on.
    pub async fn install(url: &str) -> Self {
        let statements: &[&str] = if url.starts_with("sqlite:") {
            &[SQLITE_REFUSE]
        } else {
            &[PG_FUNCTION, PG_LOCK[0], PG_LOCK[1], PG_REFUSE, "COMMIT"]
        };
        run(url, statements).await;
        Self {
            url: url.to_owned(),
        }
    }

    /// The database accepts entries again.
    pub async fn lift(self) {
        let statements: &[&str] = match self.url.starts_with("sqlite:") {
            true => &["DROP TRIGGER quota_test_refuse"],
            false => &[
                PG_LOCK[0],
                PG_LOCK[1],
                "DROP TRIGGER quota_test_refuse ON ledger_entries",
                "COMMIT",
            ],
        };
        run(&self.url, statements).await;
    }
}

async fn run(url: &str, statements: &[&str]) {
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        for statement in statements {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        for statement in statements {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
    }
}

/// Rows in the ledger at `url`, counted in SQL.
pub async fn ledger_rows(url: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM ledger_entries";
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }
}

/// SQLite's write lock, held by a connection of the test's own (as another process would
/// hold it) until released: the service's inserts wait for their busy timeout, then fail.
pub struct WriteLock(sqlx::SqliteConnection);

impl WriteLock {
    /// Takes the write lock of the SQLite database at `url`.
    pub async fn take(url: &str) -> Self {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        Self(conn)
    }

    /// Lets go of it.
    pub async fn release(mut self) {
        sqlx::query("COMMIT").execute(&mut self.0).await.unwrap();
    }
}
