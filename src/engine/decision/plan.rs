//! A decision's plan: the policies that apply, their counters and window parameters at `now`,
//! and how a store's [`Evaluation`] becomes a [`Decision`].

use crate::domain::{
    Attributes, Budget, CounterCharge, FieldError, FieldErrors, Measure, Mode, Policy,
    PolicyAmount, Subject, Window,
};
use crate::engine::alerts::{named, CounterAlert, TogetherAlerts};
use crate::engine::codec::{KeptPolicy, KeptTerms};
use crate::engine::decision::policies::{ActionPolicies, PolicyCache};
use crate::engine::store::{Algorithm, Charge, Evaluation, Outcome, Restore};
use crate::engine::{
    decision::window, decision::Decider, reset_time, seconds_until, ConsumeRequest, Decision,
    EngineError, PolicyDecision,
};
use crate::keys::{self, SubjectKeys};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use std::sync::Arc;

/// Everything one decision needs, computed once.
pub(in crate::engine) struct Plan {
    /// The action's policies (enabled ones, with overrides).
    pub(crate) policies: Arc<ActionPolicies>,
    /// The subject's keys.
    pub(crate) keys: SubjectKeys,
    /// One charge per enabled policy that applies to the request (its `match` admits
    /// it), in policy order.
    pub(crate) charges: Vec<Planned>,
    /// The clock's time, to the millisecond: every window of the plan is computed at it.
    pub(crate) now: DateTime<Utc>,
}

/// One charge of a plan: what the counter store applies, and what the answer says of it.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Planned {
    /// What the counter store applies.
    pub(crate) charge: Charge,
    /// Its policy, as an index into `policies.enabled`.
    pub(crate) policy: usize,
    /// The budget it goes to.
    pub(crate) budget: Budget,
    /// Its policy's window length, seconds.
    pub(crate) window_seconds: u64,
}

impl Decider {
    /// The plan of `request` at the clock's `now`: the policies whose `match` admits it,
    /// each with its budget. A request lacking an attribute that the scope of an applying
    /// policy names is invalid (no budget is skipped silently).
    pub(in crate::engine) fn plan(&self, request: &ConsumeRequest) -> Result<Plan, EngineError> {
        self.plan_at(request, self.now())
    }

    /// The plan of `request` at `now` (several requests decided together share one).
    pub(in crate::engine) fn plan_at(
        &self,
        request: &ConsumeRequest,
        now: DateTime<Utc>,
    ) -> Result<Plan, EngineError> {
        plan_in(&self.cache, &self.prefix, request, now)
    }
}

/// The plan of `request` at `now` under the policies of `cache` (the live ones, or a
/// backtest's), its counters under `prefix`.
pub(in crate::engine) fn plan_in(
    cache: &PolicyCache,
    prefix: &str,
    request: &ConsumeRequest,
    now: DateTime<Utc>,
) -> Result<Plan, EngineError> {
    let ConsumeRequest {
        action,
        subject,
        amount,
        attributes,
        anonymous,
        ..
    } = request;
    let policies = cache
        .action(action.as_str())
        .ok_or_else(|| EngineError::UnknownAction(action.clone()))?;
    let keys = SubjectKeys::new(prefix, action, subject);
    let count = policies.enabled.len();
    let mut charges = Vec::with_capacity(count);
    let mut errors = FieldErrors::default();
    for (i, (policy, policy_key)) in policies.enabled.iter().zip(&policies.keys).enumerate() {
        if !policy.spec.applies_to(subject, attributes) {
            continue;
        }
        if *anonymous && policy.spec.scope.has_subject() {
            errors.push(FieldError::new(
                "subject",
                format!("required by the scope of policy '{}'", policy.id),
            ));
            continue;
        }
        let budget = match policy.spec.scope.is_default() {
            true => Budget::of_subject(subject),
            false => {
                let budget = policy
                    .spec
                    .scope
                    .budget(policy.id.as_str(), subject, attributes);
                match errors.take(budget) {
                    Some(budget) => budget,
                    None => continue,
                }
            }
        };
        let zone = match zone_of(policy, attributes) {
            Ok(zone) => zone,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        let (algorithm, period, seconds) = algorithm_for(policy, zone, now);
        let cost = match amount.get() {
            0 => 0,
            _ => policy.spec.measure.cost(*amount).get(),
        };
        let key = match policy.spec.scope.has_subject() {
            true => keys.budget_counter(policy_key, period, &budget),
            false => keys::shared_counter(prefix, action, policy_key, period, &budget),
        };
        charges.push(Planned {
            charge: Charge {
                key,
                algorithm,
                limit: policies.limit_for(policy, &budget, now),
                cost,
                enforce: policy.spec.mode == Mode::Enforce,
            },
            policy: i,
            budget,
            window_seconds: seconds,
        });
    }
    if !errors.0.is_empty() {
        errors.0.dedup_by(|a, b| a.field == b.field);
        return Err(EngineError::Invalid(errors));
    }
    Ok(Plan {
        policies,
        keys,
        charges,
        now,
    })
}

impl Plan {
    /// The plans of several requests of one action at one `now`, decided as one: every
    /// plan's charges, a counter charged by several plans (the same budget of the same
    /// policy) once, with their costs summed, so that together they are held to its limit;
    /// and, per plan, where its charges are in the combined plan. `None` without plans.
    pub(in crate::engine) fn combined(plans: &[Plan]) -> Option<(Plan, Vec<Vec<usize>>)> {
        let first = plans.first()?;
        let mut combined = Plan {
            policies: first.policies.clone(),
            keys: first.keys.clone(),
            charges: Vec::new(),
            now: first.now,
        };
        let mut picks = Vec::with_capacity(plans.len());
        for plan in plans {
            let mut pick = Vec::with_capacity(plan.charges.len());
            for planned in &plan.charges {
                let key = &planned.charge.key;
                match combined.charges.iter().position(|c| c.charge.key == *key) {
                    Some(j) => {
                        let kept = &mut combined.charges[j].charge;
                        kept.cost = kept.cost.saturating_add(planned.charge.cost);
                        pick.push(j);
                    }
                    None => {
                        pick.push(combined.charges.len());
                        combined.charges.push(planned.clone());
                    }
                }
            }
            picks.push(pick);
        }
        Some((combined, picks))
    }

    /// The charges as the counter store takes them: a copy, since the store's port knows
    /// nothing of plans (a few small values per decision).
    pub(in crate::engine) fn store_charges(&self) -> Vec<Charge> {
        self.charges.iter().map(|p| p.charge.clone()).collect()
    }

    /// `now` in Unix ms.
    pub(crate) fn now_ms(&self) -> i64 {
        self.now.timestamp_millis()
    }

    /// The `i`th charge's policy.
    fn policy(&self, i: usize) -> &Policy {
        &self.policies.enabled[self.charges[i].policy]
    }

    /// The charges' policies, in charge order.
    pub(super) fn applied_policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.charges
            .iter()
            .map(|p| &self.policies.enabled[p.policy])
    }

    /// The decision when no policy applies (all disabled, or none matches): allowed,
    /// nothing counted.
    pub(crate) fn empty_decision(&self) -> Decision {
        Decision {
            allowed: true,
            retry_after_seconds: None,
            degraded: false,
            policies: Vec::new(),
            at: self.now,
        }
    }

    /// The decision the store's evaluation amounts to.
    pub(crate) fn decision(&self, evaluation: &Evaluation) -> Decision {
        let now_ms = self.now_ms();
        let mut retry_at: Option<i64> = Some(now_ms);
        let mut decisions = Vec::with_capacity(self.charges.len());
        for (i, (charge, outcome)) in self.charges.iter().zip(&evaluation.outcomes).enumerate() {
            if charge.charge.enforce && !outcome.allowed {
                retry_at = match (retry_at, outcome.retry_at_ms) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
            decisions.push(self.policy_decision(i, outcome));
        }
        let retry_after_seconds = match evaluation.allowed {
            true => None,
            false => retry_at.map(|at| seconds_until(now_ms, at)),
        };
        Decision {
            allowed: evaluation.allowed,
            retry_after_seconds,
            degraded: false,
            policies: decisions,
            at: self.now,
        }
    }

    /// The answer when the counter store is down and the operator chose to fail open.
    pub(crate) fn degraded_decision(&self) -> Decision {
        let outcome = Outcome {
            used: 0,
            allowed: true,
            resets_at_ms: self.now_ms(),
            retry_at_ms: None,
        };
        Decision {
            allowed: true,
            retry_after_seconds: None,
            degraded: true,
            policies: (0..self.charges.len())
                .map(|i| self.policy_decision(i, &outcome))
                .collect(),
            at: self.now,
        }
    }

    fn policy_decision(&self, i: usize, outcome: &Outcome) -> PolicyDecision {
        let policy = self.policy(i);
        let planned = &self.charges[i];
        let limit = planned.charge.limit;
        PolicyDecision {
            policy_id: policy.id.clone(),
            measure: policy.spec.measure,
            mode: policy.spec.mode,
            limit,
            used: outcome.used,
            remaining: limit.saturating_sub(outcome.used),
            resets_at: match policy.spec.window {
                Window::Lifetime => None,
                _ => reset_time(outcome.resets_at_ms),
            },
            allowed: outcome.allowed,
            window_seconds: planned.window_seconds,
            budget: planned.budget.clone(),
        }
    }

    /// The per-policy amounts a charge of this plan puts on its policies.
    pub(crate) fn policy_amounts(&self, only_ledger_denials: bool) -> Vec<PolicyAmount> {
        self.applied_policies()
            .zip(&self.charges)
            .filter(|(p, _)| !only_ledger_denials || p.spec.ledger_denials)
            .map(|(p, c)| PolicyAmount {
                policy_id: p.id.clone(),
                amount: c.charge.cost,
                scope: p.spec.scope.clone(),
            })
            .collect()
    }

    /// Whether a denial of this plan is recorded in the ledger.
    pub(crate) fn records_denials(&self) -> bool {
        self.applied_policies().any(|p| p.spec.ledger_denials)
    }

    /// The counters this plan charges, with how to give each charge back later.
    ///
    /// A per-request maximum charges no counter: it has nothing to give back or rebuild.
    pub(crate) fn counter_charges(&self) -> Vec<CounterCharge> {
        let now_ms = self.now_ms();
        self.applied_policies()
            .zip(self.charges.iter().map(|p| &p.charge))
            .filter_map(|(policy, charge)| {
                Some(CounterCharge {
                    policy_id: policy.id.clone(),
                    key: charge.key.as_str().to_owned(),
                    restore: restore_of(charge, now_ms)?,
                    by_amount: policy.spec.measure == Measure::Amount,
                    charged: charge.cost,
                    scope: policy.spec.scope.clone(),
                })
            })
            .collect()
    }

    /// The static part of each policy's answer, for an idempotency record.
    pub(crate) fn kept_policies(&self) -> Vec<KeptPolicy> {
        self.applied_policies()
            .zip(&self.charges)
            .map(|(p, c)| KeptPolicy {
                policy_id: p.id.clone(),
                measure: p.spec.measure,
                mode: p.spec.mode,
                limit: c.charge.limit,
                window_seconds: c.window_seconds,
                scope: p.spec.scope.clone(),
                alert_thresholds: p.spec.alert_thresholds.clone(),
            })
            .collect()
    }

    /// What an alerting entry keeps of each policy ([`Plan::kept_policies`], borrowed).
    pub(crate) fn kept_terms(&self) -> impl Iterator<Item = KeptTerms<'_>> {
        self.applied_policies()
            .zip(&self.charges)
            .map(|(p, c)| KeptTerms {
                measure: p.spec.measure,
                mode: p.spec.mode,
                limit: c.charge.limit,
                window_seconds: c.window_seconds,
                thresholds: p.spec.alert_thresholds.percents(),
            })
    }

    /// Whether a policy of the plan alerts: its entry then carries its answer, from which
    /// the thresholds it crossed are read (`engine::alerts`).
    pub(crate) fn alerts(&self) -> bool {
        self.applied_policies()
            .any(|p| !p.spec.alert_thresholds.is_empty())
    }

    /// Whether `evaluation` (of this plan, allowed) took a budget across one of its
    /// policy's alert thresholds: only then does its entry need its answer kept.
    pub(crate) fn crosses(&self, evaluation: &Evaluation) -> bool {
        self.applied_policies()
            .zip(&self.charges)
            .zip(&evaluation.outcomes)
            .any(|((policy, planned), outcome)| {
                let thresholds = &policy.spec.alert_thresholds;
                let before = outcome.used.saturating_sub(planned.charge.cost);
                !thresholds.is_empty()
                    && !thresholds
                        .crossed(planned.charge.limit, before, outcome.used)
                        .is_empty()
            })
    }

    /// What the entry of requests decided together as this plan keeps when a policy of
    /// it alerts ([`TogetherAlerts`], then a newline: the store appends the numbers).
    pub(in crate::engine) fn together_kept(&self) -> Option<String> {
        if !self.alerts() {
            return None;
        }
        let together = self
            .charges
            .iter()
            .map(|planned| {
                let policy = &self.policies.enabled[planned.policy];
                let thresholds = policy.spec.alert_thresholds.percents();
                (!thresholds.is_empty()).then(|| CounterAlert {
                    policy_id: policy.id.as_str().to_owned(),
                    budget: named(&planned.budget),
                    limit: planned.charge.limit,
                    thresholds: thresholds.to_vec(),
                    resets_at_ms: None,
                })
            })
            .collect();
        let costs = self.charges.iter().map(|p| p.charge.cost).collect();
        let text = serde_json::to_string(&TogetherAlerts { together, costs }).ok()?;
        Some(format!("{text}\n"))
    }

    /// The usage levels at which the plan's alerting policies reach a threshold, with
    /// their charge's index: what a store needs to tell a crossing (as
    /// [`Plan::crosses`] does) without the policies.
    pub(crate) fn alert_levels(&self) -> Vec<(usize, u64)> {
        self.applied_policies()
            .zip(&self.charges)
            .enumerate()
            .flat_map(|(i, (policy, planned))| {
                let limit = planned.charge.limit;
                policy
                    .spec
                    .alert_thresholds
                    .percents()
                    .iter()
                    .map(move |&percent| (i, crate::domain::level(percent, limit)))
                    .filter(|&(_, level)| level > 0)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The longest window of the plan's policies, ms.
    pub(crate) fn longest_window_ms(&self) -> i64 {
        let seconds = self
            .charges
            .iter()
            .map(|p| p.window_seconds)
            .max()
            .unwrap_or(0);
        i64::try_from(seconds).unwrap_or(i64::MAX / 2_000) * 1_000
    }
}

/// Rebuilds a decision from an idempotency record (kept with the original request's
/// `attributes`) and the evaluation it kept, for a retry by `subject`.
pub(in crate::engine) fn replayed_decision(
    subject: &Subject,
    attributes: &Attributes,
    kept: &[KeptPolicy],
    evaluation: &Evaluation,
    at: DateTime<Utc>,
) -> Decision {
    let policies = kept
        .iter()
        .zip(&evaluation.outcomes)
        .map(|(k, o)| PolicyDecision {
            policy_id: k.policy_id.clone(),
            measure: k.measure,
            mode: k.mode,
            limit: k.limit,
            used: o.used,
            remaining: k.limit.saturating_sub(o.used),
            resets_at: reset_time(o.resets_at_ms),
            allowed: o.allowed,
            window_seconds: k.window_seconds,
            budget: k.scope.budget_of(subject, attributes),
        })
        .collect();
    Decision {
        allowed: evaluation.allowed,
        retry_after_seconds: None,
        degraded: false,
        policies,
        at,
    }
}

/// How a charge made at `now_ms` is given back or rebuilt; `None` for a per-request
/// maximum, which charges nothing.
fn restore_of(charge: &Charge, now_ms: i64) -> Option<Restore> {
    Some(match charge.algorithm {
        Algorithm::Calendar { period_end_ms } => Restore::Calendar { period_end_ms },
        Algorithm::ZonedCalendar { period_end_ms } => Restore::ZonedCalendar {
            period_end_ms,
            charged_at_ms: now_ms,
        },
        Algorithm::Rolling { bucket_ms, buckets } => Restore::Rolling {
            bucket: now_ms.div_euclid(bucket_ms),
            bucket_ms,
            buckets,
        },
        Algorithm::TokenBucket { period_ms } => Restore::TokenBucket {
            period_ms,
            limit: charge.limit,
        },
        Algorithm::Lifetime => Restore::Lifetime,
        Algorithm::Request => return None,
    })
}

/// The zone a calendar policy with a `timezone_attribute` counts in for a request: the
/// attribute's, when the request has it (an unknown name is invalid), else the window's.
/// `None` for every other policy.
fn zone_of(policy: &Policy, attributes: &Attributes) -> Result<Option<Tz>, FieldError> {
    let Some(attribute) = &policy.spec.zone_attribute else {
        return Ok(None);
    };
    let Window::Calendar { timezone, .. } = policy.spec.window else {
        return Ok(None);
    };
    match attributes.get(attribute) {
        None => Ok(Some(timezone)),
        Some(name) => name.parse().map(Some).map_err(|_| {
            FieldError::new(
                format!("attributes.{attribute}"),
                format!("'{name}' is not an IANA time zone name (e.g. Asia/Tokyo)"),
            )
        }),
    }
}

/// The store algorithm for `policy` at `now` (in `zone`, the request's own, when the policy
/// has a zone attribute), the calendar period (start, Unix seconds) that its key names if
/// any, and the window length in seconds.
fn algorithm_for(
    policy: &Policy,
    zone: Option<Tz>,
    now: DateTime<Utc>,
) -> (Algorithm, Option<i64>, u64) {
    match policy.spec.window {
        Window::Calendar {
            period,
            timezone,
            anchors,
        } if zone.is_some() => {
            let zone = zone.unwrap_or(timezone);
            let (start, end) = window::calendar_bounds(period, anchors, zone, now);
            let seconds = (end - start).num_seconds().max(1) as u64;
            let algorithm = Algorithm::ZonedCalendar {
                period_end_ms: end.timestamp_millis(),
            };
            (algorithm, None, seconds)
        }
        Window::Calendar {
            period,
            timezone,
            anchors,
        } => {
            let (start, end) = window::calendar_bounds(period, anchors, timezone, now);
            let seconds = (end - start).num_seconds().max(1) as u64;
            let algorithm = Algorithm::Calendar {
                period_end_ms: end.timestamp_millis(),
            };
            (algorithm, Some(start.timestamp()), seconds)
        }
        Window::Rolling {
            seconds,
            bucket_seconds,
        } => {
            let algorithm = Algorithm::Rolling {
                bucket_ms: bucket_seconds as i64 * 1_000,
                buckets: (seconds / bucket_seconds) as i64,
            };
            (algorithm, None, seconds)
        }
        Window::TokenBucket { seconds } => {
            let algorithm = Algorithm::TokenBucket {
                period_ms: seconds as i64 * 1_000,
            };
            (algorithm, None, seconds)
        }
        Window::Request => (Algorithm::Request, None, 0),
        Window::Lifetime => (Algorithm::Lifetime, None, 0),
    }
}
