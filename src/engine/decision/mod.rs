//! The decision path: a request planned against its action's policies at the clock's
//! `now` ([`plan`], with the calendar math of [`window`] and the in-process [`policies`]),
//! decided in one counter-store call and recorded as one unit of work ([`consume`]); quota
//! given back ([`giveback`]); consumes whose budgets sit in several Redis Cluster slots
//! ([`crossslot`], the one part that asks the deployment something: whether Redis is a
//! cluster). It never asks how the ledger is written: the ledger pipeline
//! (`engine::pipeline`) does what the deployment needs with each decided change, and an
//! attempt answered 503 that Redis may have applied is handed to recovery to be voided.

pub(crate) mod consume;
pub(crate) mod crossslot;
pub(crate) mod giveback;
mod invariants;
pub(crate) mod plan;
pub(crate) mod policies;
pub mod window;

use crate::domain::{Action, Attributes, Quantity, Subject};
use crate::engine::store::StoreError;
use crate::engine::{ConsumeRequest, Decision, Engine, EngineError, OnStoreError};
use crate::logs::Throttle;

impl Engine {
    /// Decides `request` without charging (a check). Consumes go through [`Engine::consume`].
    pub(crate) async fn check(&self, request: &ConsumeRequest) -> Result<Decision, EngineError> {
        let plan = self.plan(request)?;
        if plan.charges.is_empty() {
            return Ok(plan.empty_decision());
        }
        let evaluated = match self.across_slots(&plan) {
            true => self.evaluate_across(&plan).await,
            false => {
                self.counters
                    .evaluate(plan.now_ms(), &plan.store_charges(), false)
                    .await
            }
        };
        match evaluated {
            Ok(evaluation) => Ok(plan.decision(&evaluation)),
            Err(error) => self.on_store_failure(&plan, error),
        }
    }

    /// Current usage of every enabled policy of the action that applies to the subject with
    /// `attributes`; charges nothing.
    pub(crate) async fn usage(
        &self,
        action: &Action,
        subject: &Subject,
        attributes: &Attributes,
    ) -> Result<Decision, EngineError> {
        let plan = self.plan(&ConsumeRequest {
            action: action.clone(),
            subject: subject.clone(),
            amount: Quantity::ZERO,
            idempotency_key: None,
            attributes: attributes.clone(),
            anonymous: false,
        })?;
        if plan.charges.is_empty() {
            return Ok(plan.empty_decision());
        }
        let evaluation = match self.across_slots(&plan) {
            true => self.evaluate_across(&plan).await?,
            false => {
                self.counters
                    .evaluate(plan.now_ms(), &plan.store_charges(), false)
                    .await?
            }
        };
        Ok(plan.decision(&evaluation))
    }

    /// The degraded answer when the store is down and the operator chose to fail open.
    pub(in crate::engine) fn on_store_failure(
        &self,
        plan: &plan::Plan,
        error: StoreError,
    ) -> Result<Decision, EngineError> {
        if matches!(error, StoreError::Rebuilding { .. }) {
            self.want_rebuild();
        }
        match error {
            // Never fail open while shedding: a flood must not switch the limits off.
            error if error.is_transient() && self.load.overloaded() => Err(EngineError::Overloaded),
            error if error.is_transient() && self.on_store_error == OnStoreError::Allow => {
                static SITE: Throttle = Throttle::new();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %error, count, "counter store unavailable; allowing (degraded)");
                }
                Ok(plan.degraded_decision())
            }
            error => Err(error.into()),
        }
    }
}
