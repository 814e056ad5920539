//! The activity API: the ledger aggregated per action and UTC hour over the last hours,
//! and the subjects denied most; what the operator console's "today" view charts.

use super::extract::AdminRead;
use super::problem::{ApiError, Problem};
use super::responses::{AdminAuthProblems, QueryProblems};
use super::wire::{Slug, SubjectText};
use super::AppState;
use crate::domain::{Action, FieldError, FieldErrors};
use crate::engine::ledger::{DeniedSubject, HourActivity};
use actix_web::{get, web};
use chrono::{DateTime, Duration, DurationRound, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Hours covered when `hours` is not given.
const DEFAULT_HOURS: u32 = 24;

/// The most hours one answer covers: a week.
const MAX_HOURS: u32 = 168;

/// How many of the most-denied subjects an answer lists.
const TOP_DENIED: u32 = 10;

/// Which activity to aggregate. Unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActivityQuery {
    /// How many hours, ending with the current one: 1-168, default 24.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 168)]
    pub(crate) hours: Option<String>,
    /// Only this action.
    #[param(value_type = Option<Slug>)]
    pub(crate) action: Option<String>,
}

/// One UTC hour of an action.
#[derive(Debug, Serialize, ToSchema, PartialEq, Eq)]
pub(crate) struct HourOut {
    /// The hour's start (UTC).
    pub(crate) hour: DateTime<Utc>,
    /// Allowed consumes and holds recorded in the hour.
    pub(crate) charges: u64,
    /// Their units together (minor units for money), before any refund.
    #[schema(maximum = 9007199254740991_i64)]
    pub(crate) amount: u64,
    /// Denials recorded in the hour (by policies with `ledger_denials`).
    pub(crate) denials: u64,
}

/// One action's hours.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ActionActivity {
    /// The action.
    #[schema(example = "sms")]
    pub(crate) action: String,
    /// Exactly `hours` items, oldest first, one per UTC hour (zeros where nothing happened).
    pub(crate) hours: Vec<HourOut>,
}

/// A subject denied often.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeniedOut {
    /// The action.
    #[schema(example = "sms")]
    pub(crate) action: String,
    /// The subject.
    #[schema(value_type = SubjectText)]
    pub(crate) subject: String,
    /// Its denials recorded over the span.
    pub(crate) denials: u64,
}

/// The ledger's activity over the last hours.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Activity {
    /// The first hour's start (UTC).
    pub(crate) from: DateTime<Utc>,
    /// The end of the current hour (UTC): entries before it are counted.
    pub(crate) to: DateTime<Utc>,
    /// How many hours each action lists.
    pub(crate) hours: u32,
    /// Each action with an entry in the span, by name.
    pub(crate) actions: Vec<ActionActivity>,
    /// At most 10 (action, subject) pairs with the most recorded denials, most first.
    pub(crate) top_denied: Vec<DeniedOut>,
}

/// Parses the query: the number of hours and the action, collecting every invalid field.
fn parse(query: &ActivityQuery) -> Result<(u32, Option<Action>), ApiError> {
    let mut errors = FieldErrors::default();
    let hours = match query.hours.as_deref() {
        None => Some(DEFAULT_HOURS),
        Some(text) => errors.take(
            text.parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_HOURS).contains(n))
                .ok_or_else(|| {
                    FieldError::new(
                        "hours",
                        format!("must be a whole number from 1 to {MAX_HOURS}"),
                    )
                }),
        ),
    };
    let action = query
        .action
        .as_deref()
        .and_then(|a| errors.take(Action::parse("action", a)));
    Ok(errors.finish(|| (hours.unwrap_or(DEFAULT_HOURS), action))?)
}

/// The span of `hours` hours ending with the one `now` falls in: `[from, to)`.
fn span(now: DateTime<Utc>, hours: u32) -> (DateTime<Utc>, DateTime<Utc>) {
    let this_hour = now.duration_trunc(Duration::hours(1)).unwrap_or(now);
    let to = this_hour + Duration::hours(1);
    (to - Duration::hours(i64::from(hours)), to)
}

/// Spreads the rows SQL returned (hours with entries only) over every hour of the span,
/// per action.
fn per_action(rows: Vec<HourActivity>, from: DateTime<Utc>, hours: u32) -> Vec<ActionActivity> {
    let mut actions: Vec<ActionActivity> = Vec::new();
    for row in rows {
        let Ok(index) = usize::try_from((row.hour - from).num_hours()) else {
            continue;
        };
        if actions.last().map(|a| a.action.as_str()) != Some(row.action.as_str()) {
            actions.push(ActionActivity {
                action: row.action.clone(),
                hours: (0..hours)
                    .map(|i| HourOut {
                        hour: from + Duration::hours(i64::from(i)),
                        charges: 0,
                        amount: 0,
                        denials: 0,
                    })
                    .collect(),
            });
        }
        if let Some(slot) = actions.last_mut().and_then(|a| a.hours.get_mut(index)) {
            slot.charges = row.charges;
            slot.amount = row.amount;
            slot.denials = row.denials;
        }
    }
    actions
}

/// The ledger aggregated per action and UTC hour over the last `hours` hours (the current
/// one included): allowed consumes and holds, their units, and recorded denials; with the
/// subjects denied most.
///
/// Computed in SQL from the ledger through its time index, so its cost follows the entries
/// of the span, not the whole ledger. Denials appear only for policies with
/// `ledger_denials`. With Redis, an entry counts once the drain has moved it to SQL.
#[utoipa::path(
    tag = "admin",
    params(ActivityQuery),
    responses(
        (status = 200, description = "The activity", body = Activity),
        AdminAuthProblems, QueryProblems,
        (status = 422, description = "Invalid hours or action", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Ledger store down", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])),
)]
#[get("/admin/activity")]
pub(crate) async fn activity(
    _auth: AdminRead,
    state: web::Data<AppState>,
    query: web::Query<ActivityQuery>,
) -> Result<web::Json<Activity>, ApiError> {
    let (hours, action) = parse(&query)?;
    let (from, to) = span(state.engine.now(), hours);
    let action = action.as_ref().map(Action::as_str);
    let ledger = state.engine.ledger();
    let rows = ledger.activity(from, to, action).await?;
    let top = ledger.top_denied(from, to, action, TOP_DENIED).await?;
    Ok(web::Json(Activity {
        from,
        to,
        hours,
        actions: per_action(rows, from, hours),
        top_denied: top
            .into_iter()
            .map(
                |DeniedSubject {
                     action,
                     subject,
                     denials,
                 }| DeniedOut {
                    action,
                    subject,
                    denials,
                },
            )
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("an instant")
            .with_timezone(&Utc)
    }

    #[test]
    fn the_span_ends_with_the_current_hour() {
        let (from, to) = span(at("2026-11-26T19:45:12Z"), 24);
        assert_eq!(
            (from, to),
            (at("2026-11-25T20:00:00Z"), at("2026-11-26T20:00:00Z"))
        );
        let (from, to) = span(at("2026-11-26T19:00:00Z"), 1);
        assert_eq!(
            (from, to),
            (at("2026-11-26T19:00:00Z"), at("2026-11-26T20:00:00Z"))
        );
    }

    #[test]
    fn rows_spread_over_every_hour_of_each_action() {
        let from = at("2026-11-26T10:00:00Z");
        let row = |action: &str, hour: &str, charges| HourActivity {
            action: action.to_owned(),
            hour: at(hour),
            charges,
            amount: charges * 10,
            denials: 1,
        };
        let actions = per_action(
            vec![
                row("sms", "2026-11-26T10:00:00Z", 2),
                row("sms", "2026-11-26T12:00:00Z", 3),
                row("transfer", "2026-11-26T11:00:00Z", 1),
            ],
            from,
            3,
        );
        let charges: Vec<(&str, Vec<u64>)> = actions
            .iter()
            .map(|a| {
                (
                    a.action.as_str(),
                    a.hours.iter().map(|h| h.charges).collect(),
                )
            })
            .collect();
        assert_eq!(
            charges,
            [("sms", vec![2, 0, 3]), ("transfer", vec![0, 1, 0])]
        );
        assert_eq!(actions[0].hours[2].hour, at("2026-11-26T12:00:00Z"));
        assert_eq!(actions[0].hours[2].amount, 30);
    }

    #[test]
    fn invalid_queries_name_every_bad_field() {
        for (pairs, expected) in [
            ("hours=0", vec!["hours"]),
            ("hours=169", vec!["hours"]),
            ("hours=day", vec!["hours"]),
            ("hours=0&action=Not%20One", vec!["hours", "action"]),
        ] {
            let query = web::Query::<ActivityQuery>::from_query(pairs)
                .expect("a well-formed query")
                .into_inner();
            match parse(&query) {
                Err(ApiError::Invalid(errors)) => {
                    let fields: Vec<_> = errors.0.into_iter().map(|e| e.field).collect();
                    assert_eq!(fields, expected, "{pairs}");
                }
                other => panic!("{pairs}: expected 422, got {other:?}"),
            }
        }
    }
}
