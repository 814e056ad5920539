//! The SQL ledger's readable columns: `policies` and `attributes` as JSON (`jsonb` on
//! Postgres, JSON text on SQLite), so that psql, a BI tool or a reconciliation job reads
//! the book of record without our code (docs/ledger-sql.md).
//!
//! `policies` holds one object per policy the entry concerns, in the entry's order:
//! `{"policy": id, "amount": units, "scope": [key names], "budget": {key: value}}`. The
//! amount is what the policy was charged (charge, hold), given back (refund, commit,
//! release, expire, void) or asked for (deny). `budget` names the budget the units went to
//! (the scope's values for this entry's subject and attributes); it is written for
//! queries and derived again on reading, never trusted over the scope.
//!
//! Version: the column's type is its version. Rows written before these columns existed
//! keep their compact text in `policies_compact` until `quota-ledger migrate` rewrites
//! them (`ledger::upgrade`); [`super::decode_policies`] still reads that form.

use super::{attributes_from_wire, attributes_wire, field, AttributesWire, CodecError};
use crate::domain::{Attributes, PolicyAmount, PolicyId, Scope, Subject};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const WHAT: &str = "policies column";

/// The `policies` column's value, read and written as JSON without a tree of values in
/// between.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct PoliciesColumn(Vec<PolicyColumn>);

/// The `attributes` column's value: a JSON object of strings (a JSON `null`, never
/// written, reads as none).
pub(crate) type AttributesColumn = Option<AttributesWire>;

/// One policy's part of an entry, as the `policies` column holds it.
#[derive(Serialize, Deserialize)]
struct PolicyColumn {
    policy: String,
    amount: u64,
    scope: Vec<String>,
    /// Written for queries; not read back (the scope with the row's subject and
    /// attributes gives it).
    #[serde(default, skip_deserializing)]
    budget: BTreeMap<String, String>,
}

/// The `policies` column of an entry with `policies`, made by `subject` with `attributes`.
pub(crate) fn policies_column(
    policies: &[PolicyAmount],
    subject: &Subject,
    attributes: &Attributes,
) -> PoliciesColumn {
    let columns: Vec<PolicyColumn> = policies
        .iter()
        .map(|p| PolicyColumn {
            policy: p.policy_id.to_string(),
            amount: p.amount,
            scope: p
                .scope
                .keys()
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect(),
            budget: p
                .scope
                .budget_of(subject, attributes)
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        })
        .collect();
    PoliciesColumn(columns)
}

/// Reads what [`policies_column`] wrote.
pub(crate) fn policies_from_column(
    PoliciesColumn(columns): PoliciesColumn,
) -> Result<Vec<PolicyAmount>, CodecError> {
    columns
        .into_iter()
        .map(|c| {
            Ok(PolicyAmount {
                policy_id: field(WHAT, PolicyId::parse("policy", &c.policy))?,
                amount: c.amount,
                scope: field(WHAT, Scope::parse("scope", &c.scope))?,
            })
        })
        .collect()
}

/// A request's attributes as the `attributes` column holds them: a JSON object of
/// strings, `None` when there are none.
pub(crate) fn attributes_column(attributes: &Attributes) -> Option<AttributesColumn> {
    (!attributes.is_empty()).then(|| Some(attributes_wire(attributes)))
}

/// Reads what [`attributes_column`] wrote.
pub(crate) fn attributes_from_column(
    value: Option<AttributesColumn>,
) -> Result<Attributes, CodecError> {
    const WHAT: &str = "attributes of an entry";
    match value.flatten() {
        None => Ok(Attributes::default()),
        Some(wire) => attributes_from_wire(WHAT, wire),
    }
}

/// The `totals` column of an entry with `totals` (none when it adds nothing to the
/// ledger's totals): one object per line, `{"policy_id", "budget", "period_end", "amount",
/// "allowed", "denied"}`, `period_end` in RFC 3339 as the ledger's `at` is written, which
/// the trigger that adds them to `ledger_totals` reads (migrations, `create_ledger_totals`).
pub(crate) fn totals_column(totals: &[crate::domain::TotalLine]) -> Option<serde_json::Value> {
    (!totals.is_empty()).then(|| {
        totals
            .iter()
            .map(|line| {
                serde_json::json!({
                    "policy_id": line.policy_id.as_str(),
                    "budget": line.budget,
                    "period_end": line
                        .period_end
                        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false),
                    "amount": line.amount,
                    "allowed": line.allowed,
                    "denied": line.denied,
                })
            })
            .collect()
    })
}

/// One line of the `totals` column, as [`totals_column`] writes it.
#[derive(Deserialize)]
struct TotalColumn {
    policy_id: String,
    budget: String,
    period_end: chrono::DateTime<chrono::Utc>,
    amount: i64,
    allowed: i64,
    denied: i64,
}

/// Reads the `totals` column [`totals_column`] wrote (none: the entry adds nothing).
pub(crate) fn totals_from_column(
    value: Option<serde_json::Value>,
) -> Result<Vec<crate::domain::TotalLine>, CodecError> {
    const WHAT: &str = "totals column";
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let lines: Vec<TotalColumn> =
        serde_json::from_value(value).map_err(|e| CodecError::new(WHAT, e.to_string()))?;
    lines
        .into_iter()
        .map(|line| {
            Ok(crate::domain::TotalLine {
                policy_id: field(WHAT, PolicyId::parse("policy_id", &line.policy_id))?,
                budget: line.budget,
                period_end: line.period_end,
                amount: line.amount,
                allowed: line.allowed,
                denied: line.denied,
            })
        })
        .collect()
}
