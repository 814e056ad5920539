//! The statements of the ledger's query API (`GET /quota/ledger`): only the filters given
//! become conditions, so that each shape reads through an index of its own, and an API
//! key's actions are a condition on top. Tests read both databases' plans for each shape.

use super::sql::READ_COLUMNS;
use crate::db::{Dialect, Sql};
use crate::domain::{ActionGlob, ActionSet};
use crate::engine::ledger::LedgerFilter;
use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

/// Confines `sql` to the actions one of `globs` matches (an API key's): a glob without
/// `*` is an equality, one with `*` a `LIKE` with the glob's number of segments, since
/// `%` would match across dots. An empty list matches nothing.
fn push_actions<'a, DB>(sql: &mut QueryBuilder<'a, DB>, globs: &'a [ActionGlob])
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    sql.push(" AND (1 = 0");
    for glob in globs {
        if glob.is_literal() {
            sql.push(" OR action = ").push_bind(glob.as_str());
        } else {
            sql.push(" OR (action LIKE ")
                .push_bind(glob.like_pattern())
                .push(" ESCAPE '\\' AND length(action) - length(replace(action, '.', '')) = ")
                .push_bind(glob.segments() as i64 - 1)
                .push(")");
        }
    }
    sql.push(")");
}

/// The statement of a page of the ledger's query API: the newest `limit` entries matching
/// `filter` with a `seq` below `before`. Only the filters given become conditions, so
/// that each shape can use its index ((subject, seq), (action, seq), (kind, seq),
/// (action, kind, seq), (at)) rather than `$1 IS NULL OR …`; an API key's actions are a
/// condition on top.
pub(super) fn page_query<'a, DB>(
    filter: &'a LedgerFilter,
    before: Option<i64>,
    limit: i64,
) -> QueryBuilder<'a, DB>
where
    DB: Sql,
    &'a str: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    // The rows of consumes recorded in the ledger's totals are not entries of the API:
    // `ledger_totals` holds what they add up to.
    let mut sql = QueryBuilder::<DB>::new(format!(
        "SELECT seq, {READ_COLUMNS} FROM ledger_entries WHERE totals IS NULL"
    ));
    if let Some(subject) = &filter.subject {
        sql.push(" AND subject = ").push_bind(subject.as_str());
    }
    if let Some(action) = &filter.action {
        sql.push(" AND action = ").push_bind(action.as_str());
    }
    if let ActionSet::Matching(globs) = &filter.actions {
        push_actions(&mut sql, globs);
    }
    if let Some(kind) = filter.kind {
        // A subject's entries are few: SQLite, which keeps no statistics, is told not to
        // read all of a kind's instead (`+kind` is no column for an index).
        let sqlite_subject = DB::DIALECT == Dialect::Sqlite && filter.subject.is_some();
        sql.push(if sqlite_subject {
            " AND +kind = "
        } else {
            " AND kind = "
        })
        .push_bind(kind.as_str());
    }
    if let Some(from) = filter.from {
        sql.push(" AND at >= ").push_bind(from);
    }
    if let Some(to) = filter.to {
        sql.push(" AND at < ").push_bind(to);
    }
    if let Some(before) = before {
        sql.push(" AND seq < ").push_bind(before);
    }
    sql.push(" ORDER BY seq DESC LIMIT ").push_bind(limit);
    sql
}

/// The text of the statement that reads a page of entries matching `filter` with a `seq`
/// below `before` (when given), on Postgres (`postgres`) or SQLite: for checks of its plan.
/// Its parameters are, in order: the subject, the action, the kind, `from`, `to`, `before`
/// and the page size, each when given.
pub fn page_statement(postgres: bool, filter: &LedgerFilter, before: Option<i64>) -> String {
    if postgres {
        page_query::<sqlx::Postgres>(filter, before, 100).into_sql()
    } else {
        page_query::<sqlx::Sqlite>(filter, before, 100).into_sql()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::EntryKind;
    use crate::ledger::sql::tests::{assert_searches, fresh_sqlite};

    /// Each filter of the query API, alone or with others, finds its rows through an
    /// index (the page without any filter reads backwards in `seq` order and stops at its
    /// limit, which is right without one).
    #[tokio::test]
    async fn every_ledger_filter_searches_an_index_on_sqlite() {
        let (pool, file) = fresh_sqlite().await;
        let filter = |f: fn(&mut LedgerFilter)| {
            let mut filter = LedgerFilter::default();
            f(&mut filter);
            filter
        };
        let shapes = [
            (filter(|f| f.subject = Some("alice".into())), "ledger_entries USING INDEX ledger_entries_subject_seq_idx (subject=?"),
            (filter(|f| f.action = Some("sms".into())), "ledger_entries USING INDEX ledger_entries_action_seq_idx (action=?"),
            (filter(|f| f.kind = Some(EntryKind::Refund)), "ledger_entries USING INDEX ledger_entries_kind_seq_idx (kind=?"),
            (
                filter(|f| {
                    f.action = Some("sms".into());
                    f.kind = Some(EntryKind::Refund);
                }),
                "ledger_entries USING INDEX ledger_entries_action_kind_seq_idx (action=? AND kind=?",
            ),
            (
                filter(|f| {
                    f.from = Some(DateTime::<Utc>::UNIX_EPOCH);
                    f.to = Some(DateTime::<Utc>::UNIX_EPOCH);
                }),
                "ledger_entries USING INDEX ledger_entries_at_idx (at>? AND at<?)",
            ),
            (
                filter(|f| {
                    f.subject = Some("alice".into());
                    f.kind = Some(EntryKind::Charge);
                    f.from = Some(DateTime::<Utc>::UNIX_EPOCH);
                }),
                "ledger_entries USING INDEX ledger_entries_subject_seq_idx (subject=?",
            ),
        ];
        for (filter, search) in &shapes {
            assert_searches(&pool, &page_statement(false, filter, Some(1_000)), search).await;
        }
        let next_page = page_statement(false, &LedgerFilter::default(), Some(1_000));
        assert_searches(
            &pool,
            &next_page,
            "ledger_entries USING INTEGER PRIMARY KEY (rowid<?)",
        )
        .await;
        pool.close().await;
        let _ = std::fs::remove_file(&file);
    }
}
