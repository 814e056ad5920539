//! `GET /admin/counters/verify`: every live budget compared with the usage the ledger
//! gives it (see `engine::verify`).

use super::extract::AdminRead;
use super::problem::{ApiError, Problem};
use super::quota::budget_out;
use super::responses::{AdminAuthProblems, QueryProblems};
use super::wire::Slug;
use super::AppState;
use crate::domain::{Action, FieldErrors};
use crate::engine::recovery::verify::{Drift, VerifyError};
use actix_web::{get, web};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Which budgets to verify. Unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerifyQuery {
    /// Only this action's budgets.
    #[param(value_type = Option<Slug>)]
    pub(crate) action: Option<String>,
}

/// One budget whose live usage differs from the ledger's.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DriftOut {
    /// The policy (null for a counter that neither the ledger nor a current policy names).
    #[schema(value_type = Option<Slug>)]
    pub(crate) policy_id: Option<String>,
    /// The budget, as answers name it (null when no ledger entry names the counter).
    pub(crate) budget: Option<BTreeMap<String, String>>,
    /// The counter's key in the counter store.
    pub(crate) key: String,
    /// Usage the live counter holds.
    #[schema(maximum = 9007199254740991_i64)]
    pub(crate) live: u64,
    /// Usage the ledger gives the budget.
    #[schema(maximum = 9007199254740991_i64)]
    pub(crate) ledger: u64,
}

/// The outcome of a verify.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct VerifyOut {
    /// Budgets compared.
    pub(crate) checked: usize,
    /// Those whose live usage differs from the ledger's; empty when none does.
    pub(crate) drift: Vec<DriftOut>,
    /// Budgets that could not be compared (not in `checked`): on a Redis Cluster, those
    /// shared by subjects while consumes across slots never paused during the verify.
    pub(crate) not_compared: usize,
}

impl From<Drift> for DriftOut {
    fn from(drift: Drift) -> Self {
        Self {
            policy_id: drift.policy_id.map(|p| p.as_str().to_owned()),
            budget: drift.budget.as_ref().map(budget_out),
            key: drift.key,
            live: drift.live,
            ledger: drift.ledger,
        }
    }
}

/// Compares every live budget (of `action`, or of every action) with the usage the ledger
/// gives it: the counters are the ledger's cache, so they must agree.
///
/// Requests in flight are in both or in neither: a verify waits for the changes being
/// committed, then reads the live counters and the ledger at one cut. Its cost is a replay
/// of the ledger's horizon (the longest window) into memory.
#[utoipa::path(
    tag = "admin",
    params(VerifyQuery),
    responses(
        (status = 200, description = "What was compared, and the budgets that drift", body = VerifyOut),
        AdminAuthProblems, QueryProblems,
        (status = 422, description = "Invalid action", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger or the counter store is down, or this deployment cannot verify yet: cannot tell", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])),
)]
#[get("/admin/counters/verify")]
pub(crate) async fn verify(
    _auth: AdminRead,
    state: web::Data<AppState>,
    query: web::Query<VerifyQuery>,
) -> Result<web::Json<VerifyOut>, ApiError> {
    let mut errors = FieldErrors::default();
    let action = query
        .action
        .as_deref()
        .and_then(|a| errors.take(Action::parse("action", a)));
    errors.finish(|| ())?;
    let verified = state
        .engine
        .recovery()
        .verify(action.as_ref())
        .await
        .map_err(|error| match error {
            VerifyError::Unsettled(_) => ApiError::Unavailable(error.to_string()),
            VerifyError::Engine(error) => error.into(),
        })?;
    Ok(web::Json(VerifyOut {
        checked: verified.checked,
        drift: verified.drift.into_iter().map(DriftOut::from).collect(),
        not_compared: verified.not_compared,
    }))
}
