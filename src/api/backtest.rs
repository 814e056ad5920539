//! `POST /admin/backtest`: policies tried on the recorded past (see `engine::backtest`).

use super::dto::PolicyInput;
use super::extract::{AdminAuth, ApiJson};
use super::problem::{ApiError, Problem};
use super::quota::budget_out;
use super::responses::{AdminAuthProblems, JsonBodyProblems};
use super::AppState;
use crate::domain::{FieldError, FieldErrors, Policy};
use crate::engine::recovery::backtest::{Backtest, PolicyOutcome, MAX_DAYS, MAX_POLICIES};
use actix_web::{post, web};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Policies to try, and the interval of the ledger to try them on.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BacktestInput {
    /// The policies, as in a policy file (`id` required), at most 32; the ledger's requests
    /// for the actions they name are replayed against them alone.
    policies: Vec<PolicyInput>,
    /// Replay entries made at or after this instant (or give `days`).
    from: Option<DateTime<Utc>>,
    /// … and before this one, at most 31 days after `from`; default: now.
    to: Option<DateTime<Utc>>,
    /// Instead of `from`: the last `days` days (1-31) before `to`.
    #[schema(minimum = 1, maximum = 31)]
    days: Option<i64>,
}

/// The budget that reached the highest usage in the replay.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PeakOut {
    budget: BTreeMap<String, String>,
    #[schema(maximum = 9007199254740991_i64)]
    used: u64,
    #[schema(maximum = 9007199254740991_i64)]
    limit: u64,
}

/// A budget the replay denied, and how often.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeniedBudgetOut {
    budget: BTreeMap<String, String>,
    denied: u64,
}

/// One policy's figures in the replay.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BacktestPolicyOut {
    policy_id: String,
    /// Replayed requests the policy applied to.
    requests: u64,
    /// Those it denied (a shadow policy: would have denied).
    denied: u64,
    /// Those it denied that were allowed when they were made.
    newly_denied: u64,
    /// Those denied when made (recorded denials: `ledger_denials`) that the replay allowed.
    newly_allowed: u64,
    /// The budget with the highest usage; `null` when nothing was charged.
    peak: Option<PeakOut>,
    /// The budgets it denied most (at most 10, most first).
    top_denied: Vec<DeniedBudgetOut>,
    /// Requests of the policy's action in the interval that were recorded in the
    /// ledger's totals (policies with `record: totals`): a backtest replays entries only,
    /// so these are not replayed, nor counted in `requests`.
    in_totals: u64,
}

/// What the policies would have done.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BacktestOut {
    /// Per policy, in the order given.
    policies: Vec<BacktestPolicyOut>,
    /// Ledger entries replayed.
    entries: u64,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

impl From<PolicyOutcome> for BacktestPolicyOut {
    fn from(o: PolicyOutcome) -> Self {
        Self {
            policy_id: o.policy_id.as_str().to_owned(),
            requests: o.requests,
            denied: o.denied,
            newly_denied: o.newly_denied,
            newly_allowed: o.newly_allowed,
            peak: o.peak.map(|(budget, used, limit)| PeakOut {
                budget: budget_out(&budget),
                used,
                limit,
            }),
            top_denied: o
                .top_denied
                .into_iter()
                .map(|(budget, denied)| DeniedBudgetOut {
                    budget: budget_out(&budget),
                    denied,
                })
                .collect(),
            in_totals: o.in_totals,
        }
    }
}

/// The policies of `inputs`, or every field error, named `policies[i].field`.
fn parse_policies(inputs: Vec<PolicyInput>, now: DateTime<Utc>) -> Result<Vec<Policy>, ApiError> {
    let mut errors = FieldErrors::default();
    if inputs.is_empty() || inputs.len() > MAX_POLICIES {
        errors.push(FieldError::new(
            "policies",
            format!("1 to {MAX_POLICIES} policies, not {}", inputs.len()),
        ));
    }
    let mut policies: Vec<Policy> = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.into_iter().enumerate() {
        match input.parse() {
            Ok((Some(id), spec)) => {
                if policies.iter().any(|p| p.id == id) {
                    errors.push(FieldError::new(
                        format!("policies[{i}].id"),
                        format!("'{id}' is listed twice"),
                    ));
                }
                policies.push(Policy {
                    id,
                    spec,
                    created_at: now,
                    updated_at: now,
                    version: 1,
                });
            }
            Ok((None, _)) => {
                errors.push(FieldError::new(format!("policies[{i}].id"), "is required"));
            }
            Err(FieldErrors(found)) => {
                for error in found {
                    errors.push(FieldError::new(
                        format!("policies[{i}].{}", error.field),
                        error.message,
                    ));
                }
            }
        }
    }
    errors.finish(|| policies).map_err(ApiError::Invalid)
}

/// Replays the ledger's recorded requests of `[from, to)` for the actions the given
/// policies name (charges, holds and their settlements, refunds, recorded denials) against
/// those policies instead of the live ones, from empty counters at `from`: what they would
/// have denied, and whom.
///
/// A request the replay denies charges nothing; a refund or settlement of it is passed
/// over. Live counters and the ledger are never touched. One backtest runs at a time per
/// instance. Denials are in the ledger only for policies with `ledger_denials`: without
/// them, `newly_allowed` cannot count requests denied live.
#[utoipa::path(
    tag = "admin",
    request_body = BacktestInput,
    responses(
        (status = 200, description = "Per policy: requests, denied, newly denied and allowed, the peak and the budgets denied most", body = BacktestOut),
        AdminAuthProblems, JsonBodyProblems,
        (status = 409, description = "Another backtest is running on this instance", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger is down", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])),
)]
#[post("/admin/backtest")]
pub(crate) async fn backtest(
    _auth: AdminAuth,
    state: web::Data<AppState>,
    ApiJson(input): ApiJson<BacktestInput>,
) -> Result<web::Json<BacktestOut>, ApiError> {
    let now = state.engine.now();
    let BacktestInput {
        policies,
        from,
        to,
        days,
    } = input;
    let policies = parse_policies(policies, now)?;
    let mut errors = FieldErrors::default();
    // Default: up to now, this millisecond's entries included.
    let to = to.unwrap_or(now + Duration::milliseconds(1));
    let from = match (from, days) {
        (Some(from), None) => from,
        (None, Some(days)) if (1..=MAX_DAYS).contains(&days) => to - Duration::days(days),
        (None, Some(_)) => {
            return Err(ApiError::invalid("days", format!("1 to {MAX_DAYS}")));
        }
        _ => {
            return Err(ApiError::invalid(
                "from",
                "give `from` or `days`, not both or neither",
            ));
        }
    };
    if from >= to {
        errors.push(FieldError::new("from", "must be before `to`"));
    } else if to - from > Duration::days(MAX_DAYS) {
        errors.push(FieldError::new(
            "to",
            format!("at most {MAX_DAYS} days after `from`"),
        ));
    }
    if let Some(days) = state.ledger_retention_days {
        let kept_since = now - Duration::days(i64::from(days));
        if from < kept_since {
            errors.push(FieldError::new(
                "from",
                format!(
                    "before what the ledger keeps ({days} days, QUOTA_LEDGER_RETENTION_DAYS): \
                     from {kept_since} on"
                ),
            ));
        }
    }
    errors.finish(|| ()).map_err(ApiError::Invalid)?;
    let Ok(_running) = state.backtests.try_lock() else {
        return Err(ApiError::Conflict(
            "another backtest is running on this instance; retry when it is done".to_owned(),
        ));
    };
    let Backtest { policies, entries } =
        state.engine.recovery().backtest(policies, from, to).await?;
    Ok(web::Json(BacktestOut {
        policies: policies.into_iter().map(BacktestPolicyOut::from).collect(),
        entries,
        from,
        to,
    }))
}
