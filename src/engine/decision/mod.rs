//! The decision path: a request planned against its action's policies at the clock's
//! `now` ([`plan`], with the calendar math of [`window`] and the in-process [`policies`]),
//! decided in one counter-store call and recorded as one unit of work (`apply`, which every
//! change passes: consumes and holds from [`consume`], quota given back from [`giveback`]); consumes whose budgets sit in several Redis Cluster slots
//! ([`crossslot`], the one part that asks the deployment something: whether Redis is a
//! cluster). It never asks how the ledger is written: the ledger pipeline
//! (`engine::pipeline`) does what the deployment needs with each decided change, and an
//! attempt answered 503 that Redis may have applied is handed to recovery to be voided.

mod apply;
pub(crate) mod consume;
pub(crate) mod crossslot;
pub(crate) mod giveback;
mod invariants;
pub(crate) mod plan;
pub(crate) mod policies;
mod totals;
pub mod window;

use crate::clock::Clock;
use crate::domain::{Action, Attributes, Quantity, Subject};
use crate::engine::faults::Faults;
use crate::engine::followup::Followup;
use crate::engine::ledger::LedgerStore;
use crate::engine::load::Load;
use crate::engine::pipeline::Pipeline;
use crate::engine::store::{CounterStore, StoreError};
use crate::engine::{ConsumeRequest, Decision, EngineError, OnStoreError};
use crate::logs::Throttle;
use chrono::{DateTime, Utc};
use policies::PolicyCache;
use std::sync::Arc;

/// The decision path, a part of the engine of its own: it reaches the ledger pipeline
/// through the [`Pipeline`] it is handed, and recovery only through the [`Followup`] port.
pub(crate) struct Decider {
    counters: Arc<dyn CounterStore>,
    cache: Arc<PolicyCache>,
    clock: Arc<dyn Clock>,
    prefix: String,
    on_store_error: OnStoreError,
    /// Read by refunds and holds.
    ledger: Arc<dyn LedgerStore>,
    /// Whether admission control is shedding load (a timeout is then ours, not Redis's).
    load: Arc<Load>,
    /// When the holds this instance knows of fall due, per shard.
    hold_dues: giveback::HoldDues,
    pipeline: Arc<Pipeline>,
    followup: Arc<dyn Followup>,
    /// The failpoints tests arm (shared with the drain).
    faults: Arc<Faults>,
}

/// What the decision path decides with, wired by the engine's composition.
pub(crate) struct DeciderPorts {
    pub(crate) counters: Arc<dyn CounterStore>,
    pub(crate) cache: Arc<PolicyCache>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) prefix: String,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) ledger: Arc<dyn LedgerStore>,
    pub(crate) load: Arc<Load>,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) followup: Arc<dyn Followup>,
    pub(crate) faults: Arc<Faults>,
}

impl Decider {
    /// The decision path over `ports`.
    pub(crate) fn new(ports: DeciderPorts) -> Self {
        let DeciderPorts {
            counters,
            cache,
            clock,
            prefix,
            on_store_error,
            ledger,
            load,
            pipeline,
            followup,
            faults,
        } = ports;
        Self {
            counters,
            cache,
            clock,
            prefix,
            on_store_error,
            ledger,
            load,
            hold_dues: giveback::HoldDues::default(),
            pipeline,
            followup,
            faults,
        }
    }

    /// The current time on the clock, to the millisecond (see `Engine::now`).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(self.clock.now(), 3)
    }

    /// Whether a store `error` is answered as a degraded allow (`QUOTA_ON_STORE_ERROR=allow`).
    pub(crate) fn fails_open(&self, error: &StoreError) -> bool {
        error.is_transient() && self.on_store_error == OnStoreError::Allow
    }
}

impl Decider {
    /// Decides `request` without charging (a check). Consumes go through [`Decider::consume`].
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
            self.followup.want_rebuild();
        }
        match error {
            // Never fail open while shedding: a flood must not switch the limits off.
            error if error.is_transient() && self.load.overloaded() => Err(EngineError::Overloaded),
            error if self.fails_open(&error) => {
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
