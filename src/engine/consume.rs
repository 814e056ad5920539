//! Consumes and holds: the charge, its idempotency record, its ledger entry and (for a
//! hold) its record, all in one atomic counter-store call.

use super::codec::{self, ConsumeRecord, HoldRecord};
use super::plan::{replayed_decision, Plan};
use super::store::{
    Decided, Effects, Evaluation, HoldOpen, IdempotencyRecord, LedgerAppend, StoreError, Undo,
};
use super::{from_millis, ConsumeRequest, Decision, Engine, EngineError};
use crate::domain::{ConsumptionId, EntryId, EntryKind, HoldId, KeptAnswer, LedgerEntry};
use crate::keys;
use chrono::{DateTime, Utc};

/// Idempotency records live at least a day, and at least as long as the longest window.
const MIN_IDEMPOTENCY_MS: i64 = 24 * 3_600_000;

/// How long a retry waits for its idempotency key's first attempt to be committed or
/// undone before it is answered 409: past the longest a ledger commit waits (SQLite's busy
/// timeout, 5 s; a Postgres connection's, 3 s).
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Hold records outlive their hold by a week, so late settlement attempts get a clear 409.
pub(super) const HOLD_RECORD_EXTRA_MS: i64 = 7 * 24 * 3_600_000;

/// A hold's id and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldTicket {
    /// Names the hold and the shard where its record lives.
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

/// One consume or hold before it is decided: its ids, and the ledger entry it records if
/// allowed (and if denied, when a policy asks for denials).
pub(super) struct Attempt {
    consumption_id: Option<ConsumptionId>,
    /// The hold's ticket and its time to live, ms.
    hold: Option<(HoldTicket, i64)>,
    pub(super) allowed_entry: LedgerEntry,
    pub(super) denied_entry: Option<LedgerEntry>,
}

impl Attempt {
    pub(super) fn new(plan: &Plan, request: &ConsumeRequest, hold_ttl: Option<u64>) -> Self {
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
        let entry = |kind: EntryKind, denial: bool| LedgerEntry {
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
        };
        let kind = match hold {
            Some(_) => EntryKind::Hold,
            None => EntryKind::Charge,
        };
        Self {
            allowed_entry: entry(kind, false),
            denied_entry: plan.records_denials().then(|| entry(EntryKind::Deny, true)),
            consumption_id,
            hold,
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

impl Engine {
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

    #[expect(
        clippy::too_many_lines,
        reason = "the consume sequence, which `together` repeats; the two are to become one path"
    )]
    async fn charge(
        &self,
        request: &ConsumeRequest,
        hold_ttl: Option<u64>,
    ) -> Result<Consumed, EngineError> {
        let plan = self.plan(request)?;
        let attempt = Attempt::new(&plan, request, hold_ttl);
        // A hold goes to the store even when no policy applies: its record must exist, so
        // that it can be settled.
        if plan.charges.is_empty() && hold_ttl.is_none() {
            self.record(vec![attempt.allowed_entry.clone()]).await?;
            return Ok(attempt.answer(plan.empty_decision()));
        }
        // Only a store that streams the ledger has a backlog (Redis).
        let backlog = self.backlog();
        if let Some(backlog) = backlog.filter(|b| b.is_full()) {
            return Err(EngineError::BacklogFull { max: backlog.max() });
        }
        let effects = self.effects(&plan, request, &attempt);
        // Until the entry is committed: a snapshot must see both or neither.
        let _cut = self.cut.read().await;
        let across = self.across_slots(&plan);
        let decided = match across {
            true => {
                self.decide_across(&plan, &effects, &attempt.allowed_entry)
                    .await
            }
            false => self.decide_waiting(&plan, &effects).await,
        };
        let decided = match decided {
            Ok(Decided::Fresh(_))
                if self.counters.streams_ledger()
                    && super::faults::fault!(self, "store.reply_lost") =>
            {
                Err(StoreError::Timeout(
                    "failpoint store.reply_lost: the reply was lost".to_owned(),
                ))
            }
            decided => decided,
        };
        match decided {
            Ok(Decided::Fresh(evaluation)) => {
                let decision = plan.decision(&evaluation);
                if let Some(backlog) = backlog {
                    let appended = decision.allowed || attempt.denied_entry.is_some();
                    backlog.appended(u64::from(appended));
                }
                match decision.allowed {
                    true => {
                        let entry = LedgerEntry {
                            kept_answer: kept_answer(&plan, &effects, &evaluation),
                            ..attempt.allowed_entry.clone()
                        };
                        self.commit_or_undo(vec![entry], plan.now_ms(), || {
                            undo_charge(&attempt.allowed_entry, &effects)
                        })
                        .await?;
                    }
                    // A denial changed nothing: its entry (if kept) is only recorded.
                    false if !self.counters.streams_ledger() => {
                        self.record(attempt.denied_entry.iter().cloned().collect())
                            .await?;
                    }
                    false => {}
                }
                Ok(attempt.answer(decision))
            }
            Ok(Decided::Replayed { record, evaluation }) => replay(request, &record, &evaluation),
            Ok(Decided::InFlight) => Err(EngineError::Conflict(format!(
                "a request with idempotency key '{}' is still being decided; retry shortly",
                request
                    .idempotency_key
                    .as_ref()
                    .map_or("", |key| key.as_str())
            ))),
            Ok(Decided::Refused) => Err(EngineError::Store(StoreError::Protocol(
                "a consume was refused as a reservation".to_owned(),
            ))),
            Err(error) => {
                // Redis may have run a call that timed out or lost its connection: if the
                // answer is 503, the attempt is voided once that is settled (engine::void).
                let in_doubt = effects.ledger.as_ref().filter(|_| {
                    matches!(error, StoreError::Timeout(_) | StoreError::Unavailable(_))
                });
                let decision = match self.on_store_failure(&plan, error) {
                    Ok(decision) => decision,
                    Err(answer) => {
                        if let Some(ledger) = in_doubt {
                            let key = effects.idempotency.as_ref().map(|i| i.key.clone());
                            let id = attempt.allowed_entry.id.to_string();
                            let intent =
                                across.then(|| keys::intent(&self.prefix, plan.keys.shard, &id));
                            self.doubt(&attempt.allowed_entry, &ledger.stream, key, intent);
                        }
                        return Err(answer);
                    }
                };
                // Failing open: the consume is accepted uncounted, but never unrecorded:
                // with the ledger down too, it is answered 503.
                self.record(vec![attempt.allowed_entry.clone()]).await?;
                Ok(attempt.answer(decision))
            }
        }
    }

    /// One store decision; while the idempotency key's first attempt is in flight (its
    /// entry commits), decided again every millisecond for up to [`IN_FLIGHT_WAIT`]: the
    /// retry then replays the first attempt's answer once committed, or is decided afresh
    /// once it was undone.
    async fn decide_waiting(&self, plan: &Plan, effects: &Effects) -> Result<Decided, StoreError> {
        let started = std::time::Instant::now();
        loop {
            let decided = self
                .counters
                .decide(plan.now_ms(), &plan.charges, true, effects)
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
                pending: !self.counters.streams_ledger(),
            };
            (idem, record.policies)
        });
        let (idempotency, kept_policies) = keyed.unzip();
        // A keyed consume's entry carries the answer kept for its retries (the script
        // appends the numbers), so that a Redis that lost its data gets it back.
        let allowed = |entry: &LedgerEntry| match (&idempotency, &kept_policies) {
            (Some(idem), Some(policies)) => {
                codec::encode_entry_keeping(entry, now_ms + idem.ttl_ms, policies)
            }
            _ => codec::encode_entry(entry),
        };
        let ledger = self.counters.streams_ledger().then(|| LedgerAppend {
            stream: keys::ledger_stream(&self.prefix, plan.keys.shard),
            allowed: allowed(&attempt.allowed_entry),
            denied: attempt.denied_entry.as_ref().map(codec::encode_entry),
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
}

/// What undoes the charge `entry` records, with its `effects` (kept answer, hold).
pub(super) fn undo_charge(entry: &LedgerEntry, effects: &Effects) -> Undo {
    Undo::Charge {
        counters: entry.counters.clone(),
        idempotency: effects.idempotency.as_ref().map(|idem| idem.key.clone()),
        hold: effects.hold.as_ref().map(|hold| {
            (
                hold.record_key.clone(),
                (hold.index_key.clone(), hold.hold_id.clone()),
            )
        }),
    }
}

/// The answer the store keeps under the consume's idempotency key (if any), for the
/// ledger: a restart keeps it again from there. The store keeps exactly this.
fn kept_answer(plan: &Plan, effects: &Effects, evaluation: &Evaluation) -> Option<KeptAnswer> {
    effects.idempotency.as_ref().map(|idem| KeptAnswer {
        text: codec::encode_replay(&idem.record, evaluation),
        expires_at_ms: plan.now_ms() + idem.ttl_ms,
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
