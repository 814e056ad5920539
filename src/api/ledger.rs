//! The ledger API: the recorded history, newest first, cursor-paginated.

use super::extract::{op, Access};
use super::problem::{ApiError, Problem};
use super::responses::{QueryProblems, ReaderAuthProblems};
use super::wire::{AttributesMap, Slug, SubjectText};
use super::AppState;
use crate::domain::{Action, FieldError, FieldErrors, Subject};
use crate::domain::{EntryKind, LedgerEntry};
use crate::engine::ledger::{LedgerFilter, MAX_PAGE};
use actix_web::{get, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Entries per page when `limit` is not given.
pub(crate) const DEFAULT_PAGE: u32 = 100;

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, Serialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EntryKindDto {
    /// An allowed consume charged its policies.
    Charge,
    /// Part or all of a charge was given back.
    Refund,
    /// A hold reserved quota.
    Hold,
    /// A hold was settled; the unsettled rest was given back.
    Commit,
    /// A hold was given back on request.
    Release,
    /// A hold was given back because it expired unsettled.
    Expire,
    /// A consume was denied (recorded for policies with `ledger_denials`).
    Deny,
    /// A charge or hold given back whole: its request was answered 503 while Redis may
    /// still have decided it, and did (the request never took effect).
    Void,
}

impl From<EntryKind> for EntryKindDto {
    fn from(kind: EntryKind) -> Self {
        match kind {
            EntryKind::Charge => Self::Charge,
            EntryKind::Refund => Self::Refund,
            EntryKind::Hold => Self::Hold,
            EntryKind::Commit => Self::Commit,
            EntryKind::Release => Self::Release,
            EntryKind::Expire => Self::Expire,
            EntryKind::Deny => Self::Deny,
            EntryKind::Void => Self::Void,
        }
    }
}

/// One policy's part of a ledger entry.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyAmountOut {
    /// The policy.
    pub(crate) policy_id: String,
    /// Units charged (charge, hold, and the excess of an `over_captured` commit) or given
    /// back (refund, commit, release, expire); for a deny, the units asked for.
    #[schema(maximum = 9007199254740991_i64)]
    pub(crate) amount: u64,
    /// The budget the units went to (see the consume answer's `budget`).
    #[schema(example = json!({"subject": "user-42"}))]
    pub(crate) budget: BTreeMap<String, String>,
}

/// A ledger entry as served.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LedgerEntryOut {
    /// Unique per entry.
    pub(crate) id: String,
    /// When the decision was made (UTC).
    pub(crate) at: DateTime<Utc>,
    /// What happened.
    pub(crate) kind: EntryKindDto,
    /// The action.
    #[schema(example = "transfer")]
    pub(crate) action: String,
    /// The subject.
    #[schema(example = "user-42")]
    pub(crate) subject: String,
    /// The request's amount: charged, refunded, held, settled or released.
    #[schema(maximum = 9007199254740991_i64)]
    pub(crate) amount: u64,
    /// The consume this entry belongs to (charges, refunds, denials).
    pub(crate) consumption_id: Option<String>,
    /// The hold this entry belongs to (holds and their settlement).
    pub(crate) hold_id: Option<String>,
    /// The caller's idempotency key, if any.
    pub(crate) idempotency_key: Option<String>,
    /// Per policy amounts.
    pub(crate) policies: Vec<PolicyAmountOut>,
    /// True on a commit that kept more than its hold (`over_capture`): its `policies` are
    /// the excess charged to each amount policy, not amounts given back.
    pub(crate) over_captured: bool,
    /// The request's attributes (a give-back's are those of its charge or hold).
    #[schema(value_type = AttributesMap)]
    pub(crate) attributes: BTreeMap<String, String>,
}

impl From<&LedgerEntry> for LedgerEntryOut {
    fn from(e: &LedgerEntry) -> Self {
        Self {
            id: e.id.to_string(),
            at: e.at,
            kind: e.kind.into(),
            action: e.action.to_string(),
            subject: e.subject.to_string(),
            amount: e.amount,
            consumption_id: e.consumption_id.map(|id| id.to_string()),
            hold_id: e.hold_id.map(|id| id.to_string()),
            idempotency_key: e.idempotency_key.as_ref().map(ToString::to_string),
            policies: e
                .policies
                .iter()
                .map(|p| PolicyAmountOut {
                    policy_id: p.policy_id.to_string(),
                    amount: p.amount,
                    budget: super::quota::budget_out(&e.budget(&p.scope)),
                })
                .collect(),
            // A commit names counters only for the excess it charged.
            over_captured: e.kind == EntryKind::Commit && !e.counters.is_empty(),
            attributes: e
                .attributes
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }
}

/// A page of ledger entries, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LedgerList {
    /// The entries, newest (most recently recorded) first.
    pub(crate) items: Vec<LedgerEntryOut>,
    /// Pass as `cursor` to get the next, older page; null on the last page.
    pub(crate) next_cursor: Option<String>,
    /// The enabled policies (of the action asked for, or of every action readable) that
    /// record `totals`: a consume that charges only such policies, with no idempotency
    /// key, writes no entry and is not listed here; the ledger's totals
    /// (`ledger_totals`) hold what such consumes add up to. Empty when there are none.
    pub(crate) policies_recording_totals: Vec<String>,
}

/// Which entries to list. Every filter is optional; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct LedgerQuery {
    /// Only this subject.
    #[param(value_type = Option<SubjectText>)]
    pub(crate) subject: Option<String>,
    /// Only this action.
    #[param(value_type = Option<Slug>)]
    pub(crate) action: Option<String>,
    /// Only this kind: charge, refund, hold, commit, release, expire or deny.
    #[param(value_type = Option<EntryKindDto>)]
    pub(crate) kind: Option<String>,
    /// Only entries at or after this instant (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub(crate) from: Option<String>,
    /// Only entries before this instant (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub(crate) to: Option<String>,
    /// Entries per page: 1-1000, default 100.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<String>,
    /// The `next_cursor` of the previous page (opaque; only values handed out are accepted).
    #[param(pattern = "^s1\\.(?:[1-9a-f][0-9a-f]{0,14}|[1-7][0-9a-f]{15})$")]
    pub(crate) cursor: Option<String>,
}

fn instant(field: &str, text: &str) -> Result<DateTime<Utc>, FieldError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            FieldError::new(
                field,
                "must be an RFC 3339 instant such as 2026-11-21T12:00:00Z",
            )
        })
}

fn page_size(text: Option<&str>) -> Result<u32, FieldError> {
    let Some(text) = text else {
        return Ok(DEFAULT_PAGE);
    };
    match text.parse::<u32>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(FieldError::new(
            "limit",
            format!("must be a whole number from 1 to {MAX_PAGE}"),
        )),
    }
}

/// Turns the query into a filter and a page size, collecting every invalid field.
fn parse(query: &LedgerQuery) -> Result<(LedgerFilter, u32), ApiError> {
    let mut errors = FieldErrors::default();
    let mut filter = LedgerFilter::default();
    if let Some(subject) = &query.subject {
        filter.subject = errors.take(Subject::parse("subject", subject).map(|s| s.to_string()));
    }
    if let Some(action) = &query.action {
        filter.action = errors.take(Action::parse("action", action).map(|a| a.to_string()));
    }
    if let Some(kind) = &query.kind {
        filter.kind = errors.take(EntryKind::parse(kind).ok_or_else(|| {
            FieldError::new(
                "kind",
                "must be one of charge, refund, hold, commit, release, expire, deny",
            )
        }));
    }
    filter.from = query
        .from
        .as_deref()
        .and_then(|t| errors.take(instant("from", t)));
    filter.to = query
        .to
        .as_deref()
        .and_then(|t| errors.take(instant("to", t)));
    // `to <= from` is a valid, empty range (JSON Schema cannot state the rule either).
    let limit = errors.take(page_size(query.limit.as_deref()));
    let limit = errors.finish(|| limit.unwrap_or(DEFAULT_PAGE))?;
    Ok((filter, limit))
}

/// The recorded history (charges, refunds, holds and their settlement, recorded
/// denials), newest first, cursor-paginated.
///
/// Pages follow the order in which entries were recorded: entries recorded while a client
/// walks the pages never make it see an entry twice or skip one. With Redis, an entry
/// appears here once the background drain has moved it from Redis (shortly after the
/// consume); without Redis, before the consume is answered.
#[utoipa::path(
    tag = "quota",
    params(LedgerQuery),
    responses(
        (status = 200, description = "A page of entries", body = LedgerList),
        ReaderAuthProblems, QueryProblems,
        (status = 422, description = "Invalid filter, limit or cursor", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Ledger store down", body = Problem, content_type = "application/problem+json"),
    ),
)]
#[get("/quota/ledger")]
pub(crate) async fn list_ledger(
    access: Access<op::Ledger>,
    state: web::Data<AppState>,
    query: web::Query<LedgerQuery>,
) -> Result<web::Json<LedgerList>, ApiError> {
    let (mut filter, limit) = parse(&query)?;
    if let Some(action) = &filter.action {
        access.require(&Action::parse("action", action).map_err(FieldErrors::from)?)?;
    }
    filter.actions = access.actions;
    let totals = state.engine.policies().recording_totals(|action| {
        filter.actions.contains(action)
            && filter
                .action
                .as_deref()
                .is_none_or(|a| a == action.as_str())
    });
    let page = state
        .engine
        .ledger()
        .page(&filter, limit, query.cursor.as_deref())
        .await?;
    Ok(web::Json(LedgerList {
        items: page.items.iter().map(LedgerEntryOut::from).collect(),
        next_cursor: page.next_cursor,
        policies_recording_totals: totals.iter().map(|id| id.as_str().to_owned()).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &str) -> LedgerQuery {
        web::Query::<LedgerQuery>::from_query(pairs)
            .expect("a well-formed query")
            .into_inner()
    }

    fn fields(pairs: &str) -> Vec<String> {
        match parse(&query(pairs)) {
            Err(ApiError::Invalid(errors)) => errors.0.into_iter().map(|e| e.field).collect(),
            other => panic!("{pairs}: expected 422, got {other:?}"),
        }
    }

    #[test]
    fn invalid_queries_name_every_bad_field() {
        for (pairs, expected) in [
            ("limit=0", vec!["limit"]),
            ("limit=1001", vec!["limit"]),
            ("limit=-1", vec!["limit"]),
            ("limit=ten", vec!["limit"]),
            ("kind=charges", vec!["kind"]),
            ("from=yesterday", vec!["from"]),
            ("to=2026-11-21", vec!["to"]),
            ("action=Not%20An%20Action", vec!["action"]),
            ("subject=", vec!["subject"]),
            ("kind=x&limit=0&action=A", vec!["action", "kind", "limit"]),
        ] {
            assert_eq!(fields(pairs), expected, "{pairs}");
        }
    }

    #[test]
    fn a_valid_query_becomes_a_filter_with_the_default_page_size() {
        let (filter, limit) = parse(&query(
            "subject=user-42&action=transfer&kind=refund&from=2026-11-21T07:00:00-05:00",
        ))
        .expect("valid");
        assert_eq!(limit, DEFAULT_PAGE);
        assert_eq!(filter.subject.as_deref(), Some("user-42"));
        assert_eq!(filter.action.as_deref(), Some("transfer"));
        assert_eq!(filter.kind, Some(EntryKind::Refund));
        assert_eq!(
            filter.from.map(|t| t.to_rfc3339()).as_deref(),
            Some("2026-11-21T12:00:00+00:00")
        );
        assert_eq!(filter.to, None);
        assert_eq!(parse(&query("limit=1000")).expect("valid").1, 1000);
    }
}
