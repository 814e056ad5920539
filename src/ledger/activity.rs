//! The ledger's activity over a span, aggregated in SQL: charges, their units and
//! recorded denials per action and UTC hour, and the subjects denied most. The operator
//! console's "today" view reads it through `GET /admin/activity`.
//!
//! Both queries read hourly rollups (`ledger_hourly`, `ledger_hourly_denials`), which
//! triggers keep in the same transaction as the entries (see their migration), through
//! their primary keys (a range on `hour`): their cost grows with the hours asked for and
//! the actions and denied subjects within them, never with the entries. Hours are
//! numbered from the Unix epoch, in UTC; a span covers each hour it overlaps.

use super::sql::{db_error, SqlLedgerStore};
use crate::db::{ColumnType, Sql};
use crate::engine::ledger::{DeniedSubject, HourActivity, LedgerError};
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Encode, Executor, IntoArguments, Row, Type};

/// The per-hour statement, before its optional action condition (`$1`, `$2`: the span's
/// hours). The sum of units is cast to BIGINT: Postgres keeps it as NUMERIC, and a sum
/// past BIGINT fails loudly rather than wrapping.
const HOURLY_SQL: &str = "SELECT action, hour, charges, CAST(amount AS BIGINT) AS amount, \
     denials FROM ledger_hourly WHERE hour >= $1 AND hour < $2";

/// The per-hour statement's order.
const HOURLY_ORDER: &str = " ORDER BY action, hour";

/// The most-denied statement, before its optional action condition.
const TOP_DENIED_SQL: &str = "SELECT action, subject, CAST(SUM(denials) AS BIGINT) AS denials \
     FROM ledger_hourly_denials WHERE hour >= $1 AND hour < $2";

/// The most-denied statement's grouping and order; `$3` is the number of subjects.
const TOP_DENIED_ORDER: &str =
    " GROUP BY action, subject ORDER BY denials DESC, action, subject LIMIT $3";

/// The two statements as the stores run them for every action: the per-hour one (`$1`,
/// `$2`: the span's hours) and the most-denied one (`$3`: how many). For checks of their
/// query plans.
pub fn statements() -> [String; 2] {
    [
        format!("{HOURLY_SQL}{HOURLY_ORDER}"),
        format!("{TOP_DENIED_SQL}{TOP_DENIED_ORDER}"),
    ]
}

/// The hours from the Unix epoch that `[from, to)` overlaps, as `[first, end)`.
pub fn hours(from: DateTime<Utc>, to: DateTime<Utc>) -> (i64, i64) {
    let first = from.timestamp().div_euclid(3_600);
    let partial = to.timestamp().rem_euclid(3_600) != 0 || to.timestamp_subsec_nanos() > 0;
    let end = to.timestamp().div_euclid(3_600) + i64::from(partial);
    (first, end)
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
    /// The rows of the statement `head` then `tail` over the hours `[from, to)` overlaps
    /// (`$1`, `$2`), `limit` (`$3`) if it takes one, and only `action`'s rows if one is
    /// given (the parameter after them).
    async fn rows_over(
        &self,
        (head, tail): (&str, &str),
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        limit: Option<u32>,
        action: Option<&str>,
    ) -> Result<Vec<DB::Row>, LedgerError> {
        let sql = match action {
            Some(_) => format!(
                "{head} AND action = ${}{tail}",
                3 + usize::from(limit.is_some())
            ),
            None => format!("{head}{tail}"),
        };
        let (first, end) = hours(from, to);
        let mut query = sqlx::query::<DB>(&sql).bind(first).bind(end);
        if let Some(limit) = limit {
            query = query.bind(i64::from(limit));
        }
        if let Some(action) = action {
            query = query.bind(action);
        }
        query.fetch_all(&self.pool).await.map_err(db_error)
    }

    /// See [`LedgerStore::activity`](crate::engine::ledger::LedgerStore::activity).
    pub(super) async fn select_activity(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        action: Option<&str>,
    ) -> Result<Vec<HourActivity>, LedgerError> {
        let rows = self
            .rows_over((HOURLY_SQL, HOURLY_ORDER), (from, to), None, action)
            .await?;
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
        let statement = (TOP_DENIED_SQL, TOP_DENIED_ORDER);
        let rows = self
            .rows_over(statement, (from, to), Some(limit), action)
            .await?;
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
    use crate::ledger::sql::tests::{assert_searches, fresh_sqlite};

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
            folded: Vec::new(),
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
            totals: Vec::new(),
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

    /// Both queries find their rows through their rollup's primary key, a range of hours,
    /// never by scanning a table.
    #[tokio::test]
    async fn activity_searches_the_rollups_by_hour_on_sqlite() {
        let (store, file) = sqlite().await;
        let [hourly, top] = statements();
        assert_searches(
            &store.pool,
            &hourly,
            "ledger_hourly USING PRIMARY KEY (hour>? AND hour<?)",
        )
        .await;
        assert_searches(
            &store.pool,
            &top,
            "ledger_hourly_denials USING PRIMARY KEY (hour>? AND hour<?)",
        )
        .await;
        store.pool.close().await;
        let _ = std::fs::remove_file(&file);
    }

    /// The hours a span overlaps: a span ending within an hour covers that hour.
    #[test]
    fn a_span_covers_each_hour_it_overlaps() {
        let (first, end) = hours(at("2026-11-26T10:00:00Z"), at("2026-11-26T12:00:00Z"));
        assert_eq!(end - first, 2);
        assert_eq!(first, at("2026-11-26T10:00:00Z").timestamp() / 3_600);
        let (first, end) = hours(at("2026-11-26T10:30:00Z"), at("2026-11-26T12:00:00.001Z"));
        assert_eq!(end - first, 3);
        assert_eq!(
            hours(at("1969-12-31T23:30:00Z"), at("1970-01-01T00:00:00Z")),
            (-1, 0)
        );
    }
}
