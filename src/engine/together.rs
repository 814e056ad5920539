//! Several consumes of one action decided as one: all charged, or none. The descriptors
//! of one gateway request (`grpc`) are decided this way.
//!
//! Each request is planned at one shared `now`; their plans combine into one
//! ([`Plan::combined`]): a counter that several requests charge (the same budget of the
//! same policy) is charged once with their costs summed, so that together they are held
//! to its limit. The combined plan is one store call, like a consume's (on a Redis Cluster,
//! the cross-slot protocol when it spans slots), and its stream entry records one ledger
//! entry per request ([`codec::encode_entries`]).

use super::consume::Attempt;
use super::plan::Plan;
use super::store::{Decided, Effects, Evaluation, LedgerAppend, StoreError, Undo};
use super::{codec, ConsumeRequest, Decision, Engine, EngineError};
use crate::domain::{EntryId, LedgerEntry};
use crate::keys;

impl Engine {
    /// Charges every one of `requests` (one action) to the policies that apply to it, all
    /// or none; one decision per request, in order. Each decision's `allowed` is the
    /// whole's; its policies say which of them denied. Without requests, none.
    #[expect(
        clippy::too_many_lines,
        reason = "the consume sequence of `consume::charge`, for several requests; the two are to become one path"
    )]
    pub(crate) async fn consume_together(
        &self,
        requests: &[ConsumeRequest],
    ) -> Result<Vec<Decision>, EngineError> {
        let now = self.now();
        let plans = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                self.plan_at(request, now).map_err(|error| match error {
                    // Which request: `requests[i].<field>`.
                    EngineError::Invalid(mut errors) => {
                        for error in &mut errors.0 {
                            error.field = format!("requests[{i}].{}", error.field);
                        }
                        EngineError::Invalid(errors)
                    }
                    other => other,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some((plan, picks)) = Plan::combined(&plans) else {
            return Ok(Vec::new());
        };
        let attempts: Vec<Attempt> = plans
            .iter()
            .zip(requests)
            .map(|(plan, request)| Attempt::new(plan, request, None))
            .collect();
        let allowed: Vec<LedgerEntry> = attempts.iter().map(|a| a.allowed_entry.clone()).collect();
        let denied: Vec<LedgerEntry> = attempts
            .iter()
            .filter_map(|a| a.denied_entry.clone())
            .collect();
        if plan.charges.is_empty() {
            self.record(allowed).await?;
            return Ok(plans.iter().map(Plan::empty_decision).collect());
        }
        let backlog = self.backlog();
        if let Some(backlog) = backlog.filter(|b| b.is_full()) {
            return Err(EngineError::BacklogFull { max: backlog.max() });
        }
        let effects = Effects {
            ledger: self.counters.streams_ledger().then(|| LedgerAppend {
                stream: keys::ledger_stream(&self.prefix, plan.keys.shard),
                allowed: codec::encode_entries(&allowed),
                denied: (!denied.is_empty()).then(|| codec::encode_entries(&denied)),
            }),
            ..Effects::default()
        };
        // Until the entries are committed: a snapshot must see both or neither.
        let _cut = self.cut.read().await;
        let across = self.across_slots(&plan);
        let attempt_id = EntryId::new();
        let decided = match across {
            true => {
                // The attempt's id, and the combined plan's counters in charge order.
                let attempt = LedgerEntry {
                    id: attempt_id,
                    counters: plan.counter_charges(),
                    ..allowed[0].clone()
                };
                self.decide_across(&plan, &effects, &attempt).await
            }
            false => {
                self.counters
                    .decide(plan.now_ms(), &plan.charges, true, &effects)
                    .await
            }
        };
        match decided {
            Ok(Decided::Fresh(evaluation)) => {
                if let Some(backlog) = backlog {
                    let appended = evaluation.allowed || !denied.is_empty();
                    backlog.appended(u64::from(appended));
                }
                match evaluation.allowed {
                    true => {
                        let undo = || Undo::Charge {
                            counters: allowed.iter().flat_map(|e| e.counters.clone()).collect(),
                            idempotency: None,
                            hold: None,
                        };
                        self.commit_or_undo(allowed.clone(), plan.now_ms(), undo)
                            .await?;
                    }
                    false if !self.counters.streams_ledger() => self.record(denied).await?,
                    false => {}
                }
                Ok(plans
                    .iter()
                    .zip(&picks)
                    .map(|(plan, pick)| {
                        plan.decision(&Evaluation {
                            allowed: evaluation.allowed,
                            outcomes: pick.iter().map(|&j| evaluation.outcomes[j]).collect(),
                        })
                    })
                    .collect())
            }
            Ok(Decided::Replayed { .. } | Decided::Refused | Decided::InFlight) => {
                Err(EngineError::Store(StoreError::Protocol(
                    "requests decided together got a replay".to_owned(),
                )))
            }
            Err(error) => {
                // As for one consume (engine::void): each charge is voided on its own.
                let in_doubt = effects.ledger.as_ref().filter(|_| {
                    matches!(error, StoreError::Timeout(_) | StoreError::Unavailable(_))
                });
                if let Err(answer) = self.on_store_failure(&plan, error) {
                    if let Some(ledger) = in_doubt {
                        let id = attempt_id.to_string();
                        let intent =
                            across.then(|| keys::intent(&self.prefix, plan.keys.shard, &id));
                        for entry in &allowed {
                            self.doubt(entry, &ledger.stream, None, intent.clone());
                        }
                    }
                    return Err(answer);
                }
                // Failing open: accepted uncounted; the ledger still records them.
                self.record(allowed).await?;
                Ok(plans.iter().map(Plan::degraded_decision).collect())
            }
        }
    }
}
