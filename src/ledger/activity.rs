//! The ledger's activity over a span, aggregated in SQL: charges, their units and
//! recorded denials per action and UTC hour, and the subjects denied most. The operator
//! console's "today" view reads it through `GET /admin/activity`.
//!
//! Both queries select their rows through the `at` index (a range on `at`), so their cost
//! grows with the entries of the span asked for, never with the whole ledger. Hours are
//! numbered from the Unix epoch in SQL, so that both databases group alike: Postgres
//! reads the epoch of a TIMESTAMPTZ, SQLite that of the RFC 3339 text it stores.

use super::sql::{db_error, SqlLedgerStore};
use crate::db::{ColumnType, Dialect, Sql};
use crate::engine::ledger::{DeniedSubject, HourActivity, LedgerError};
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Encode, Executor, IntoArguments, Row, Type};

/// Postgres: the hour of `at`, counted from the Unix epoch.
const POSTGRES_HOUR: &str = "CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT)";

/// SQLite: the hour of `at` (RFC 3339 text), counted from the Unix epoch.
const SQLITE_HOUR: &str = "(CAST(strftime('%s', at) AS INTEGER) / 3600)";

/// The hour of `at`, counted from the Unix epoch, as `dialect` computes it.
fn hour(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => POSTGRES_HOUR,
        Dialect::Sqlite => SQLITE_HOUR,
    }
}

/// The per-hour statement; `{hour}` is the database's hour expression. Sums are cast to
/// BIGINT: Postgres sums a BIGINT column into NUMERIC. A sum past BIGINT fails loudly
/// rather than wrapping.
fn activity_sql(hour: &str) -> String {
    format!(
        "SELECT action, {hour} AS hour, \
         CAST(SUM(CASE WHEN kind = 'deny' THEN 0 ELSE 1 END) AS BIGINT) AS charges, \
         CAST(SUM(CASE WHEN kind = 'deny' THEN 0 ELSE amount END) AS BIGINT) AS amount, \
         CAST(SUM(CASE WHEN kind = 'deny' THEN 1 ELSE 0 END) AS BIGINT) AS denials \
         FROM ledger_entries \
         WHERE at >= $1 AND at < $2 AND kind IN ('charge', 'hold', 'deny')"
    )
}

/// The most-denied statement, before its optional action condition.
const TOP_DENIED_SQL: &str = "SELECT action, subject, COUNT(*) AS denials FROM ledger_entries \
     WHERE at >= $1 AND at < $2 AND kind = 'deny'";

/// The most-denied statement's grouping and order; `$3` is the number of subjects.
const TOP_DENIED_ORDER: &str =
    " GROUP BY action, subject ORDER BY denials DESC, action, subject LIMIT $3";

/// The two statements as the Postgres (`postgres`) or the SQLite store runs them for every
/// action: the per-hour one (`$1`, `$2`: the span) and the most-denied one (`$3`: how
/// many). For checks of their query plans.
pub fn statements(postgres: bool) -> [String; 2] {
    let dialect = if postgres {
        Dialect::Postgres
    } else {
        Dialect::Sqlite
    };
    [
        format!("{} GROUP BY action, hour", activity_sql(hour(dialect))),
        format!("{TOP_DENIED_SQL}{TOP_DENIED_ORDER}"),
    ]
}

/// A count or sum read back from SQL, which is never negative.
fn natural(value: i64) -> Result<u64, LedgerError> {
    u64::try_from(value)
        .map_err(|_| LedgerError::Corrupt(format!("a negative ledger total: {value}")))
}

impl<DB> SqlLedgerStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
{
    /// See [`LedgerStore::activity`](crate::engine::ledger::LedgerStore::activity).
    pub(super) async fn select_activity(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
    ) -> Result<Vec<HourActivity>, LedgerError> {
        let sql = format!(
            "{}{} GROUP BY action, hour ORDER BY action, hour",
            activity_sql(hour(DB::DIALECT)),
            if action.is_some() {
                " AND action = $3"
            } else {
                ""
            },
        );
        let query = sqlx::query::<DB>(&sql).bind(from).bind(to);
        let query = match action {
            Some(action) => query.bind(action),
            None => query,
        };
        let rows = query.fetch_all(&self.pool).await.map_err(db_error)?;
        rows.iter()
            .map(|row| {
                let hour: i64 = row.try_get("hour").map_err(db_error)?;
                Ok(HourActivity {
                    action: row.try_get("action").map_err(db_error)?,
                    hour: DateTime::from_timestamp(hour.saturating_mul(3_600), 0).ok_or_else(
                        || LedgerError::Corrupt(format!("an hour out of range: {hour}")),
                    )?,
                    charges: natural(row.try_get("charges").map_err(db_error)?)?,
                    amount: natural(row.try_get("amount").map_err(db_error)?)?,
                    denials: natural(row.try_get("denials").map_err(db_error)?)?,
                })
            })
            .collect()
    }

    /// See [`LedgerStore::top_denied`](crate::engine::ledger::LedgerStore::top_denied).
    pub(super) async fn select_top_denied(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeniedSubject>, LedgerError> {
        let sql = match action {
            Some(_) => format!("{TOP_DENIED_SQL} AND action = $4{TOP_DENIED_ORDER}"),
            None => format!("{TOP_DENIED_SQL}{TOP_DENIED_ORDER}"),
        };
        let query = sqlx::query::<DB>(&sql)
            .bind(from)
            .bind(to)
            .bind(i64::from(limit));
        let query = match action {
            Some(action) => query.bind(action),
            None => query,
        };
        let rows = query.fetch_all(&self.pool).await.map_err(db_error)?;
        rows.iter()
            .map(|row| {
                Ok(DeniedSubject {
                    action: row.try_get("action").map_err(db_error)?,
                    subject: row.try_get("subject").map_err(db_error)?,
                    denials: natural(row.try_get("denials").map_err(db_error)?)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Action, EntryId, EntryKind, LedgerEntry, Subject};
    use crate::engine::ledger::LedgerStore;
    use crate::ledger::sql::tests::{assert_searches_the_at_index, fresh_sqlite};

    async fn sqlite() -> (SqlLedgerStore<sqlx::Sqlite>, std::path::PathBuf) {
        let (pool, file) = fresh_sqlite().await;
        (SqlLedgerStore { pool }, file)
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("an instant")
            .with_timezone(&Utc)
    }

    fn entry(when: &str, kind: EntryKind, action: &str, subject: &str, amount: u64) -> LedgerEntry {
        LedgerEntry {
            id: EntryId::new(),
            at: at(when),
            kind,
            action: Action::parse("action", action).expect("an action"),
            subject: Subject::parse("subject", subject).expect("a subject"),
            amount,
            consumption_id: None,
            hold_id: None,
            idempotency_key: None,
            policies: Vec::new(),
            attributes: Default::default(),
            counters: Vec::new(),
            hold_expires_at: None,
            kept_answer: None,
        }
    }

    /// Entries group by action and hour, refunds and entries outside the span count for
    /// nothing, and the most-denied subjects come most first.
    #[tokio::test]
    async fn activity_groups_by_action_and_hour_within_the_span() {
        let (store, file) = sqlite().await;
        let entries = [
            entry("2026-11-26T09:59:59.999Z", EntryKind::Charge, "sms", "a", 1),
            entry("2026-11-26T10:00:00Z", EntryKind::Charge, "sms", "a", 1),
            entry("2026-11-26T10:30:00.5Z", EntryKind::Hold, "sms", "b", 4),
            entry("2026-11-26T10:59:00Z", EntryKind::Deny, "sms", "b", 1),
            entry("2026-11-26T11:00:00Z", EntryKind::Deny, "sms", "b", 1),
            entry("2026-11-26T11:10:00Z", EntryKind::Deny, "sms", "a", 1),
            entry("2026-11-26T11:20:00Z", EntryKind::Refund, "sms", "a", 1),
            entry(
                "2026-11-26T11:30:00Z",
                EntryKind::Charge,
                "transfer",
                "a",
                200_000,
            ),
            entry("2026-11-26T12:00:00Z", EntryKind::Charge, "sms", "a", 1),
        ];
        store.append(&entries).await.expect("appending");
        let (from, to) = (at("2026-11-26T10:00:00Z"), at("2026-11-26T12:00:00Z"));
        let hours = store.activity(from, to, None).await.expect("activity");
        let row = |action: &str, hour: &str, charges, amount, denials| HourActivity {
            action: action.to_owned(),
            hour: at(hour),
            charges,
            amount,
            denials,
        };
        assert_eq!(
            hours,
            vec![
                row("sms", "2026-11-26T10:00:00Z", 2, 5, 1),
                row("sms", "2026-11-26T11:00:00Z", 0, 0, 2),
                row("transfer", "2026-11-26T11:00:00Z", 1, 200_000, 0),
            ]
        );
        let only = store
            .activity(from, to, Some("transfer"))
            .await
            .expect("activity");
        assert_eq!(only.len(), 1);
        let top = store.top_denied(from, to, None, 10).await.expect("top");
        let pairs: Vec<_> = top
            .iter()
            .map(|d| (d.subject.as_str(), d.denials))
            .collect();
        assert_eq!(pairs, [("b", 2), ("a", 1)]);
        assert_eq!(
            store
                .top_denied(from, to, None, 1)
                .await
                .expect("top")
                .len(),
            1
        );
        store.pool.close().await;
        let _ = std::fs::remove_file(&file);
    }

    /// Both queries find their rows through the `at` index, never by scanning the table.
    #[tokio::test]
    async fn activity_searches_the_at_index_on_sqlite() {
        let (store, file) = sqlite().await;
        for sql in statements(false) {
            assert_searches_the_at_index(&store.pool, &sql).await;
        }
        store.pool.close().await;
        let _ = std::fs::remove_file(&file);
    }
}
