//! Consumes and holds: the charge, its idempotency record, its ledger entry and (for a
//! hold) its record, all in one atomic counter-store call.

use crate::domain::{ConsumptionId, EntryId, EntryKind, HoldId, KeptAnswer, LedgerEntry};
use crate::engine::codec::{self, ConsumeRecord, HoldRecord, KeptPolicy};
use crate::engine::decision::plan::{replayed_decision, Plan};
use crate::engine::decision::Decider;
use crate::engine::store::{
    Consume, Decided, Effects, Evaluation, HoldOpen, IdempotencyRecord, LedgerAppend, OnCrossing,
    StoreError,
};
use crate::engine::{from_millis, ConsumeRequest, Decision, EngineError};
use crate::keys;
use chrono::{DateTime, Utc};

/// Idempotency records live at least a day, and at least as long as the longest window.
const MIN_IDEMPOTENCY_MS: i64 = 24 * 3_600_000;

/// How long a retry waits for its key's first attempt to be committed or undone before it
/// is answered 409: past the longest a ledger commit waits (SQLite 5 s, Postgres 3 s).
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Hold records outlive their hold by a week, so late settlement attempts get a clear 409.
pub(in crate::engine) const HOLD_RECORD_EXTRA_MS: i64 = 7 * 24 * 3_600_000;

/// A hold's id and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldTicket {
    /// Names the hold and the shard of its record.
    pub(crate) hold_id: HoldId,
    /// When it is released unless settled.
    pub(crate) expires_at: DateTime<Utc>,
}

/// The answer to a consume or hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Consumed {
    /// Allowed or denied, with every policy's usage after it.
    pub(crate) decision: Decision,
    /// The consume's id (consumes only).
    pub(crate) consumption_id: Option<ConsumptionId>,
    /// The hold (holds only, when allowed).
    pub(crate) hold: Option<HoldTicket>,
    /// True when this replays an earlier answer for the same idempotency key.
    pub(crate) replayed: bool,
}

/// What a unit of work did.
pub(in crate::engine) enum Charged {
    /// No policy applies: nothing was counted; the entries are recorded.
    Uncharged,
    /// Decided now; if allowed, charged and recorded.
    Fresh(Evaluation),
    /// A retry of a keyed consume: its kept answer, and the counters now.
    Replayed {
        /// The idempotency record.
        record: String,
        /// The counters' usage now.
        evaluation: Evaluation,
    },
    /// The key's first attempt is still being committed or undone.
    InFlight,
    /// The counter store failed and the configuration fails open: accepted uncounted,
    /// recorded.
    Degraded,
}

/// One consume or hold before it is decided: its ids, and the ledger entry it records if
/// allowed (and if denied, when a policy asks for denials).
pub(in crate::engine) struct Attempt {
    consumption_id: Option<ConsumptionId>,
    /// The hold's ticket and its time to live, ms.
    hold: Option<(HoldTicket, i64)>,
    pub(in crate::engine) allowed_entry: LedgerEntry,
    pub(in crate::engine) denied_entry: Option<LedgerEntry>,
    /// Recorded in the ledger's totals ([`Plan::records_totals`]).
    pub(in crate::engine) in_totals: bool,
}

impl Attempt {
    pub(in crate::engine) fn new(
        plan: &Plan,
        request: &ConsumeRequest,
        hold_ttl: Option<u64>,
    ) -> Self {
        let (consumption_id, hold) = match hold_ttl {
            None => (Some(ConsumptionId::new()), None),
            Some(ttl) => {
                let ttl_ms = i64::try_from(ttl).unwrap_or(i64::MAX / 2_000) * 1_000;
                let ticket = HoldTicket {
                    hold_id: HoldId::new(plan.keys.shard),
                    expires_at: from_millis(plan.now_ms() + ttl_ms),
                };
                (None, Some((ticket, ttl_ms)))
            }
        };
        // Recorded in the ledger's totals: the entry adds its lines to them, and the answer
        // names no consumption (the id stays in the entry, for a void to find it).
        let totals = plan.records_totals(request, hold.is_some());
        let entry = |kind: EntryKind, denial: bool| LedgerEntry {
            folded: Vec::new(),
            id: EntryId::new(),
            at: plan.now,
            kind,
            action: request.action.clone(),
            subject: request.subject.clone(),
            amount: request.amount.get(),
            consumption_id,
            hold_id: hold.as_ref().map(|(t, _)| t.hold_id),
            idempotency_key: request.idempotency_key.clone(),
            policies: plan.policy_amounts(denial),
            attributes: request.attributes.clone(),
            counters: if denial {
                Vec::new()
            } else {
                plan.counter_charges()
            },
            hold_expires_at: hold.as_ref().map(|(t, _)| t.expires_at).filter(|_| !denial),
            kept_answer: None,
            totals: match totals {
                true => plan.total_lines(!denial),
                false => Vec::new(),
            },
        };
        let kind = match hold {
            Some(_) => EntryKind::Hold,
            None => EntryKind::Charge,
        };
        Self {
            allowed_entry: entry(kind, false),
            denied_entry: (totals || plan.records_denials()).then(|| entry(EntryKind::Deny, true)),
            consumption_id: consumption_id.filter(|_| !totals),
            hold,
            in_totals: totals,
        }
    }

    /// The answer for `decision`: a hold is opened only if the decision allows it.
    fn answer(self, decision: Decision) -> Consumed {
        let allowed = decision.allowed;
        Consumed {
            decision,
            consumption_id: self.consumption_id,
            hold: self.hold.filter(|_| allowed).map(|(ticket, _)| ticket),
            replayed: false,
        }
    }
}

impl Decider {
    /// Charges `request` to every enabled policy of its action, atomically.
    pub(crate) async fn consume(&self, request: &ConsumeRequest) -> Result<Consumed, EngineError> {
        self.charge(request, None).await
    }

    /// Reserves `request` like a consume, until settled or `ttl_seconds` pass.
    pub(crate) async fn hold(
        &self,
        request: &ConsumeRequest,
        ttl_seconds: u64,
    ) -> Result<Consumed, EngineError> {
        self.charge(request, Some(ttl_seconds)).await
    }

    /// A consume or hold: one request, its idempotency record and (for a hold) its record.
    async fn charge(
        &self,
        request: &ConsumeRequest,
        hold_ttl: Option<u64>,
    ) -> Result<Consumed, EngineError> {
        let plan = self.plan(request)?;
        let attempt = Attempt::new(&plan, request, hold_ttl);
        let effects = self.effects(&plan, request, &attempt);
        let attempts = std::slice::from_ref(&attempt);
        match self.apply(self.charging(&plan, attempts, &effects)).await? {
            Charged::Uncharged => Ok(attempt.answer(plan.empty_decision())),
            Charged::Fresh(evaluation) => Ok(attempt.answer(plan.decision(&evaluation))),
            Charged::Degraded => Ok(attempt.answer(plan.degraded_decision())),
            Charged::Replayed { record, evaluation } => replay(request, &record, &evaluation),
            Charged::InFlight => Err(EngineError::Conflict(format!(
                "a request with idempotency key '{}' is still being decided; retry shortly",
                request
                    .idempotency_key
                    .as_ref()
                    .map_or("", |key| key.as_str())
            ))),
        }
    }

    /// Charges every one of `requests` (one action) to the policies that apply to it, all
    /// or none; one decision per request, in order. Each decision's `allowed` is the
    /// whole's; its policies say which of them denied. Without requests, none. The
    /// descriptors of one gateway request (`grpc`) are decided this way.
    ///
    /// Each request is planned at one shared `now`; their plans combine into one
    /// ([`Plan::combined`]): a counter that several requests charge (the same budget of the
    /// same policy) is charged once with their costs summed, so that together they are held
    /// to its limit. The combined plan is one unit of work, like a consume's, and its
    /// stream entry records one ledger entry per request ([`codec::encode_entries`]).
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
        let effects = Effects {
            ledger: self.together_append(&plan, &attempts),
            ..Effects::default()
        };
        match self
            .apply(self.charging(&plan, &attempts, &effects))
            .await?
        {
            Charged::Uncharged => Ok(plans.iter().map(Plan::empty_decision).collect()),
            Charged::Fresh(evaluation) => Ok(plans
                .iter()
                .zip(&picks)
                .map(|(plan, pick)| {
                    plan.decision(&Evaluation {
                        allowed: evaluation.allowed,
                        outcomes: pick.iter().map(|&j| evaluation.outcomes[j]).collect(),
                    })
                })
                .collect()),
            Charged::Degraded => Ok(plans.iter().map(Plan::degraded_decision).collect()),
            Charged::Replayed { .. } | Charged::InFlight => Err(EngineError::Store(
                StoreError::Protocol("requests decided together got a replay".to_owned()),
            )),
        }
    }

    /// The stream entry of requests decided together as `plan` (Redis): their entries, the
    /// last keeping what tells the alert thresholds the decision crosses, if a policy
    /// alerts (the store appends it only when one is crossed).
    fn together_append(&self, plan: &Plan, attempts: &[Attempt]) -> Option<LedgerAppend> {
        let mut allowed: Vec<_> = attempts.iter().map(|a| a.allowed_entry.clone()).collect();
        let plain = codec::encode_entries(&allowed);
        let kept = plan.together_kept();
        if let (Some(text), Some(last)) = (kept.clone(), allowed.last_mut()) {
            last.kept_answer = Some(KeptAnswer {
                text,
                expires_at_ms: plan.now_ms(),
            });
        }
        let keeping = codec::encode_entries(&allowed);
        let on_crossing = (kept.is_some() && keeping.starts_with(&plain)).then(|| OnCrossing {
            plain_len: plain.len(),
            levels: plan.alert_levels(),
        });
        let append = self.pipeline.ledger_append(plan.keys.shard, || {
            let denied = attempts.iter().filter_map(|a| a.denied_entry.clone());
            let denied: Vec<_> = denied.collect();
            let kept = (!denied.is_empty()).then(|| codec::encode_entries(&denied));
            (keeping, kept)
        })?;
        Some(LedgerAppend {
            keeps_answer: kept.is_some(),
            on_crossing,
            ..append
        })
    }
}

impl Decider {
    /// One store decision; while the idempotency key's first attempt is in flight (its
    /// entry commits), decided again every millisecond for up to [`IN_FLIGHT_WAIT`]: the
    /// retry then replays the first attempt's answer once committed, or is decided afresh
    /// once it was undone.
    pub(super) async fn decide_waiting(
        &self,
        plan: &Plan,
        effects: &Effects,
    ) -> Result<Decided, StoreError> {
        let started = std::time::Instant::now();
        loop {
            let decided = self
                .counters
                .decide(&Consume {
                    now_ms: plan.now_ms(),
                    charges: &plan.store_charges(),
                    commit: true,
                    effects,
                })
                .await;
            if !matches!(decided, Ok(Decided::InFlight)) || started.elapsed() >= IN_FLIGHT_WAIT {
                return decided;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// The effects of a consume: its idempotency record, ledger entries and hold record.
    fn effects(&self, plan: &Plan, request: &ConsumeRequest, attempt: &Attempt) -> Effects {
        let now_ms = plan.now_ms();
        let hold = attempt.hold.as_ref();
        let keyed = request.idempotency_key.as_ref().map(|key| {
            let record = ConsumeRecord {
                consumption_id: attempt.consumption_id,
                hold: hold.map(|(t, _)| (t.hold_id, t.expires_at.timestamp_millis())),
                amount: request.amount.get(),
                at_ms: now_ms,
                policies: plan.kept_policies(),
                attributes: request.attributes.clone(),
            };
            let scope = if hold.is_some() { 'h' } else { 'c' };
            let idem = IdempotencyRecord {
                key: plan.keys.idempotency(scope, key.as_str()),
                ttl_ms: MIN_IDEMPOTENCY_MS.max(plan.longest_window_ms() + 3_600_000),
                record: codec::encode_consume_record(&record),
                pending: self.pipeline.records_pending(),
            };
            (idem, record.policies)
        });
        let (idempotency, kept_policies) = keyed.unzip();
        // An entry whose policies alert keeps its answer too, already expired (no retry
        // replays it): it tells which thresholds the decision crossed (`engine::alerts`).
        // It matters only to an entry the store streams (`ledger_append`), written before
        // the decision; one this instance writes keeps an answer only once a crossing is
        // known (`entry_answer`).
        let alerting = idempotency.is_none() && plan.alerts();
        // A keyed consume's entry carries the answer kept for its retries (the script
        // appends the numbers), so that a Redis that lost its data gets it back.
        // Only a decision that crosses a threshold keeps its answer for alerts: the store
        // tells, and else appends the entry's plain start (`OnCrossing`).
        let mut on_crossing = None;
        let mut allowed = |entry: &LedgerEntry| match (&idempotency, &kept_policies) {
            (Some(idem), Some(policies)) => {
                let policies = policies.iter().map(KeptPolicy::terms);
                codec::encode_entry_keeping(entry, now_ms + idem.ttl_ms, policies).0
            }
            _ if alerting => {
                let policies = plan.kept_terms();
                let (text, plain_len) = codec::encode_entry_keeping(entry, now_ms, policies);
                on_crossing = Some(OnCrossing {
                    plain_len,
                    levels: plan.alert_levels(),
                });
                text
            }
            _ => codec::encode_entry(entry),
        };
        let ledger = self.pipeline.ledger_append(plan.keys.shard, || {
            let denied = attempt.denied_entry.as_ref().map(codec::encode_entry);
            (allowed(&attempt.allowed_entry), denied)
        });
        let ledger = ledger.map(|ledger| crate::engine::store::LedgerAppend {
            keeps_answer: alerting,
            on_crossing,
            totals: attempt.totals_append(&self.prefix, plan.keys.shard),
            ..ledger
        });
        let hold = hold.map(|(ticket, ttl_ms)| {
            let expires_at_ms = ticket.expires_at.timestamp_millis();
            self.hold_dues.expect(plan.keys.shard, expires_at_ms);
            let record = HoldRecord {
                action: request.action.clone(),
                subject: request.subject.clone(),
                amount: request.amount.get(),
                expires_at_ms,
                counters: attempt.allowed_entry.counters.clone(),
                attributes: request.attributes.clone(),
            };
            let hold_id = ticket.hold_id.to_string();
            HoldOpen {
                record_key: keys::hold_record(&self.prefix, plan.keys.shard, &hold_id),
                index_key: keys::holds_index(&self.prefix, plan.keys.shard),
                hold_id,
                expires_at_ms,
                record: codec::encode_hold_record(&record),
                ttl_ms: ttl_ms + HOLD_RECORD_EXTRA_MS,
            }
        });
        Effects {
            idempotency,
            ledger,
            hold,
            ..Effects::default()
        }
    }

    /// The answer the entry of `attempts` (one attempt) keeps, when this instance writes
    /// it (`Pipeline::commit_answered_or_undo`); a streamed entry got it from the store.
    pub(super) fn entry_answer(
        &self,
        plan: &Plan,
        effects: &Effects,
        attempts: &[Attempt],
        evaluation: &Evaluation,
    ) -> Option<KeptAnswer> {
        match attempts {
            [attempt] => kept_answer(plan, effects, attempt, evaluation),
            // Requests decided together: the plan is their combined one.
            _ => plan
                .together_kept()
                .filter(|_| plan.crosses(evaluation))
                .map(|record| KeptAnswer {
                    text: codec::encode_replay(record.trim_end(), evaluation),
                    expires_at_ms: plan.now_ms(),
                }),
        }
    }
}

/// The answer the store keeps under the consume's idempotency key (if any), for the
/// ledger: a restart keeps it again from there. The store keeps exactly this.
/// The answer an entry keeps: a keyed consume's, for its retries; else, when the decision
/// took a budget across a policy's alert threshold, one already expired, which tells
/// which thresholds it crossed.
fn kept_answer(
    plan: &Plan,
    effects: &Effects,
    attempt: &Attempt,
    evaluation: &Evaluation,
) -> Option<KeptAnswer> {
    if let Some(idem) = &effects.idempotency {
        return Some(KeptAnswer {
            text: codec::encode_replay(&idem.record, evaluation),
            expires_at_ms: plan.now_ms() + idem.ttl_ms,
        });
    }
    // Only a decision that crossed a threshold has an event to tell.
    (plan.alerts() && plan.crosses(evaluation)).then(|| {
        let (entry, policies) = (&attempt.allowed_entry, plan.kept_policies());
        let record = ConsumeRecord::of_entry(entry, plan.now_ms(), policies);
        KeptAnswer {
            text: codec::encode_replay(&codec::encode_consume_record(&record), evaluation),
            expires_at_ms: plan.now_ms(),
        }
    })
}

/// The answer to a retry: the original one, rebuilt from its idempotency record, unless
/// the retry asks for another amount.
fn replay(
    request: &ConsumeRequest,
    record: &str,
    evaluation: &Evaluation,
) -> Result<Consumed, EngineError> {
    let kept = codec::decode_consume_record(record).map_err(StoreError::from)?;
    if kept.amount != request.amount.get() {
        return Err(EngineError::Conflict(format!(
            "idempotency key '{}' was used with amount {}, not {}",
            request
                .idempotency_key
                .as_ref()
                .map_or("", |key| key.as_str()),
            kept.amount,
            request.amount
        )));
    }
    Ok(Consumed {
        decision: replayed_decision(
            &request.subject,
            &kept.attributes,
            &kept.policies,
            evaluation,
            from_millis(kept.at_ms),
        ),
        consumption_id: kept.consumption_id,
        hold: kept.hold.map(|(hold_id, at)| HoldTicket {
            hold_id,
            expires_at: from_millis(at),
        }),
        replayed: true,
    })
}
