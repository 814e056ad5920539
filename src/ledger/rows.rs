//! A ledger row as the SQL stores read it: its columns ([`RowValues`]), the entry they
//! record, and a page of rows read in bulk as one JSON value ([`page_sql`]).

use super::sql::{corrupt, READ_COLUMNS};
use crate::db::Dialect;
use crate::domain::{EntryId, LedgerEntry};
use crate::engine::codec::{self, AttributesColumn, EntryParts, PoliciesColumn};
use crate::engine::ledger::LedgerError;
use chrono::{DateTime, Utc};

/// A ledger row's columns, as read (one by one, or from a page read as one JSON value).
pub(super) struct RowValues {
    pub(super) id: String,
    pub(super) at: DateTime<Utc>,
    pub(super) kind: String,
    pub(super) action: String,
    pub(super) subject: String,
    pub(super) amount: i64,
    pub(super) consumption_id: Option<String>,
    pub(super) hold_id: Option<String>,
    pub(super) idempotency_key: Option<String>,
    pub(super) policies: Option<PoliciesColumn>,
    pub(super) detail: Option<String>,
    pub(super) attributes: Option<AttributesColumn>,
    pub(super) compact: Option<String>,
    pub(super) totals: Option<serde_json::Value>,
    pub(super) folded_ids: Option<String>,
}

/// A row as [`page_sql`]'s JSON holds it: `seq`, then [`READ_COLUMNS`], the JSON columns
/// as their text.
pub(super) type PageRow = (
    i64,
    String,
    String,
    String,
    String,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

impl RowValues {
    /// The entry the row records, its columns checked.
    pub(super) fn entry(self) -> Result<LedgerEntry, LedgerError> {
        let id = self.id.as_str();
        let parts = EntryParts {
            id,
            at: self.at,
            kind: &self.kind,
            action: &self.action,
            subject: &self.subject,
            amount: u64::try_from(self.amount).map_err(|e| corrupt(id, e))?,
            consumption_id: self.consumption_id.as_deref(),
            hold_id: self.hold_id.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
        };
        let policies = match (self.policies, self.compact) {
            (Some(policies), _) => codec::policies_from_column(policies),
            (None, Some(compact)) => codec::decode_policies(&compact, parts.amount),
            (None, None) => Ok(Vec::new()),
        }
        .map_err(|e| corrupt(id, e))?;
        let detail = codec::decode_detail(self.detail.as_deref(), &parts, &policies)
            .map_err(|e| corrupt(id, e))?;
        let attributes =
            codec::attributes_from_column(self.attributes).map_err(|e| corrupt(id, e))?;
        let totals = codec::totals_from_column(self.totals).map_err(|e| corrupt(id, e))?;
        let mut entry = codec::entry_from_parts(parts, policies, attributes, detail)
            .map_err(|e| corrupt(id, e))?;
        entry.totals = totals;
        if let Some(ids) = &self.folded_ids {
            entry.folded = ids
                .split(' ')
                .map(|folded| EntryId::parse(folded).map_err(|e| corrupt(id, e)))
                .collect::<Result<_, _>>()?;
        }
        Ok(entry)
    }

    /// A row of a page read as JSON, with its `seq`.
    pub(super) fn of_page(row: PageRow) -> Result<(i64, Self), LedgerError> {
        let (seq, id, at, kind, action, subject, amount, consumption_id, hold_id, key) = (
            row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8, row.9,
        );
        let values = Self {
            at: DateTime::parse_from_rfc3339(&at)
                .map_err(|e| corrupt(&id, format!("at '{at}': {e}")))?
                .with_timezone(&Utc),
            policies: json_column(&id, "policies", row.10)?,
            attributes: json_column(&id, "attributes", row.12)?,
            totals: json_column(&id, "totals", row.14)?,
            folded_ids: row.15,
            detail: row.11,
            compact: row.13,
            kind,
            action,
            subject,
            amount,
            consumption_id,
            hold_id,
            idempotency_key: key,
            id,
        };
        Ok((seq, values))
    }
}

/// A JSON column's text, read as `T`.
fn json_column<T: serde::de::DeserializeOwned>(
    id: &str,
    what: &str,
    text: Option<String>,
) -> Result<Option<T>, LedgerError> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| corrupt(id, format!("{what}: {e}"))))
        .transpose()
}

/// The statement that reads a page of entries (`seq` after `$1`, at most `$2`; of the
/// action `$3` only, with `one_action`, through its `(action, seq)` index) as one JSON
/// array of rows ([`PageRow`]): a bulk read (a rebuild, a backtest) then takes one value
/// from the database per page rather than one per column of every row.
pub(super) fn page_sql(dialect: Dialect, one_action: bool) -> String {
    let columns = "seq, id, at, kind, action, subject, amount, consumption_id, hold_id, \
                   idempotency_key";
    let action = if one_action { " AND action = $3" } else { "" };
    match dialect {
        Dialect::Postgres => format!(
            "SELECT CAST(COALESCE(json_agg(json_build_array({columns}, CAST(policies AS TEXT), \
             detail, CAST(attributes AS TEXT), policies_compact, CAST(totals AS TEXT), folded_ids) ORDER BY seq), '[]') AS TEXT) \
             FROM (SELECT seq, {READ_COLUMNS} FROM ledger_entries WHERE seq > $1{action} \
             ORDER BY seq LIMIT $2) AS page"
        ),
        Dialect::Sqlite => format!(
            "SELECT json_group_array(json_array({columns}, policies, detail, attributes, \
             policies_compact, totals, folded_ids)) \
             FROM (SELECT seq, {READ_COLUMNS} FROM ledger_entries WHERE seq > $1{action} \
             ORDER BY seq LIMIT $2)"
        ),
    }
}

/// The `folded` column of `entry`: how many consumes a folded row stands for, NULL for
/// every other row.
pub(super) fn folded_column(entry: &LedgerEntry) -> Option<i64> {
    (!entry.folded.is_empty()).then(|| i64::try_from(entry.folded.len()).unwrap_or(i64::MAX))
}

/// The `folded_ids` column of `entry`: the ids of the consumes' entries a folded row
/// stands for, hyphenated, separated by spaces; NULL for every other row.
pub(super) fn folded_ids_column(entry: &LedgerEntry) -> Option<String> {
    if entry.folded.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(37 * entry.folded.len());
    for (i, id) in entry.folded.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&id.to_string());
    }
    Some(out)
}

impl<DB> super::sql::SqlLedgerStore<DB>
where
    DB: crate::db::Sql,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    String: crate::db::ColumnType<DB>,
    DateTime<Utc>: crate::db::ColumnType<DB>,
    i64: crate::db::ColumnType<DB>,
{
    /// See `LedgerStore::folded_in`: the charge rows folded in `at`'s minute, through the
    /// `at` index, whose `folded_ids` name `id`.
    pub(super) async fn folded_row_of(
        &self,
        id: EntryId,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        let minute = at.timestamp().div_euclid(60) * 60;
        let from = DateTime::from_timestamp(minute, 0).unwrap_or(at);
        let to = from + chrono::Duration::seconds(60);
        let sql = "SELECT COUNT(*) FROM ledger_entries WHERE at >= $1 AND at < $2 \
                   AND kind = 'charge' AND folded IS NOT NULL AND folded_ids LIKE $3";
        let count: i64 = sqlx::query_scalar(sql)
            .bind(from)
            .bind(to)
            .bind(format!("%{id}%"))
            .fetch_one(&self.pool)
            .await
            .map_err(super::sql::db_error)?;
        Ok(count > 0)
    }
}
