//! Consumes whose budgets sit in several Redis Cluster slots: a budget shared by subjects
//! (a global or per-country cap) lives in a shard of its own, and a cluster runs one script
//! per slot. The protocol never over-allows, and an attempt that fails midway (a crash, a
//! timeout) leaves no charge that is neither in the ledger nor undone within about 11 s:
//!
//! 1. **Open** at home: the home budgets are charged with an intent `open` that lists every
//!    counter of the attempt, indexed by its deadline (now + [`ATTEMPT_MS`]). A kept
//!    idempotency answer is replayed here, before anything is reserved.
//! 2. **Reserve** each foreign shard in turn, from the narrowest budget to the widest (a
//!    global budget last): its budgets are charged with a reservation `open`. A shard that
//!    undid the attempt already (a tombstone) or a deadline passed refuses.
//! 3. **Finalize** at home, the commit point: only an `open` intent within its deadline
//!    becomes `committed`, with the ledger entry, the idempotency record and the hold.
//! 4. Any denial, refusal or error **abandons**: the intent becomes `abandoned` (its home
//!    charges given back once, the denial's entry appended), each foreign reservation is
//!    undone once (a missing one becomes a tombstone for 60 s), then the attempt leaves the
//!    index. An intent that committed refuses to be abandoned: the consume was charged.
//!
//! The sweeper ([`Decider::resolve_attempts`], every instance, every 2 s) abandons the
//! intents whose deadline passed [`SKEW_MS`] ago: what a crashed or stalled instance left.
//! A refund or settlement across slots keeps a pending record in the same index (given
//! back at home, with the other slots' share still to give): the sweeper gives that share. Records made
//! before a rebuild of their shard are never given back after it (they carry its epoch).
//!
//! Costs (k foreign shards): an allowed consume is k + 2 calls in sequence; a denial at
//! home is 1 + k reads; a denial in foreign shard i adds an abandon (k + 2 calls) and up
//! to k reads for the answer. A global budget's slot takes one call per consume.

use crate::domain::{CounterCharge, LedgerEntry};
use crate::engine::codec::{self, IntentRecord};
use crate::engine::decision::plan::Plan;
use crate::engine::decision::Decider;
use crate::engine::store::{
    AcrossSlots, Charge, Consume, Decided, Effects, Evaluation, Finalize, Finalized, GiveBack,
    GiveBackKind, GivenBack, IntentOpen, LedgerAppend, Outcome, ReservationOpen, StoreError,
};
use crate::keys;
use std::collections::BTreeMap;

mod share;

/// How long an attempt may take from its open to its finalize, ms.
pub(crate) const ATTEMPT_MS: i64 = 5_000;

/// The clock skew between instances tolerated, ms: the sweeper waits this long past an
/// intent's deadline before abandoning it.
pub(crate) const SKEW_MS: i64 = 5_000;

/// How long a give-back's once-marker is kept in a foreign slot, ms (giveback.lua's `f`).
pub(crate) const MARKER_TTL_MS: i64 = 600_000;

/// How many due intents one sweep resolves per shard.
const SWEEP_BATCH: usize = 100;

/// The give-back that drops a resolved attempt (or pending give-back) `member` from the
/// index of intents of `home`.
fn resolved(prefix: &str, home: u16, member: &str) -> GiveBack {
    GiveBack {
        kind: GiveBackKind::Resolved,
        pending: None,
        reports_usage: false,
        control_key: keys::intent(prefix, home, member),
        hold_index: Some((keys::intents_index(prefix, home), member.to_owned())),
        counters: Vec::new(),
        ledger: None,
        idempotency: None,
    }
}

/// The charges of one shard, as indices into the plan's charges.
struct Group {
    shard: u16,
    charges: Vec<usize>,
}

impl Decider {
    /// Whether one counter-store call reaches only one slot (a Redis Cluster): then a
    /// change across shards takes the protocol of this module.
    pub(in crate::engine) fn one_slot_per_call(&self) -> bool {
        !self.counters.atomic_across_tags()
    }

    /// Waits until every attempt across slots that reserved before now has committed or
    /// can no longer: within its deadline and the skew on a store that takes one slot per
    /// call; at once on the others, whose calls are atomic across shards.
    pub(in crate::engine) async fn attempts_across_slots_settle(&self) {
        if self.one_slot_per_call() {
            let wait = ATTEMPT_MS + SKEW_MS;
            tokio::time::sleep(std::time::Duration::from_millis(wait.unsigned_abs())).await;
        }
    }

    /// Whether `plan` charges several shards on a store that takes one per call.
    pub(in crate::engine) fn across_slots(&self, plan: &Plan) -> bool {
        self.slots_of(plan).is_some()
    }

    /// The store's cross-slot protocol when `plan` charges several shards on a store that
    /// takes one per call.
    pub(in crate::engine) fn slots_of(&self, plan: &Plan) -> Option<&dyn AcrossSlots> {
        let home = plan.keys.shard;
        let spread = plan.charges.iter().any(|c| c.charge.key.shard() != home);
        self.counters.across_slots().filter(|_| spread)
    }

    /// Decides `plan` across slots: the answer the one-call path would give, or the error
    /// that stopped it (after abandoning what it had done).
    #[expect(
        clippy::too_many_lines,
        reason = "the protocol's steps in the order the module doc lists them: open, reserve each slot, finalize"
    )]
    pub(in crate::engine) async fn decide_across(
        &self,
        slots: &dyn AcrossSlots,
        plan: &Plan,
        effects: &Effects,
        allowed: &LedgerEntry,
    ) -> Result<Decided, StoreError> {
        let home = plan.keys.shard;
        let (home_charges, groups) = groups(plan);
        // The allowed entry's counters are the plan's, in charge order.
        let counters = &allowed.counters;
        let pick = |indices: &[usize]| -> Vec<CounterCharge> {
            indices.iter().map(|&i| counters[i].clone()).collect()
        };
        let record = IntentRecord {
            home: pick(&home_charges),
            foreign: groups.iter().map(|g| (g.shard, pick(&g.charges))).collect(),
            alerts: Vec::new(),
        };
        let member = allowed.id.to_string();
        let deadline_ms = plan.now_ms() + ATTEMPT_MS;
        let intent = IntentOpen {
            key: keys::intent(&self.prefix, home, &member),
            index_key: keys::intents_index(&self.prefix, home),
            member: member.clone(),
            deadline_ms,
            record: codec::encode_intent(&record),
        };
        let denied_entry = effects.ledger.as_ref().and_then(|l| l.denied.clone());
        let open = Effects {
            idempotency: effects.idempotency.clone(),
            ledger: effects.ledger.as_ref().map(|l| LedgerAppend {
                stream: l.stream.clone(),
                allowed: String::new(),
                denied: l.denied.clone(),
                keeps_answer: false,
                on_crossing: None,
                // Across slots the entry commits at the finalize, through the stream.
                totals: None,
            }),
            intent: Some(intent.clone()),
            ..Effects::default()
        };
        let mut outcomes: Vec<Option<Outcome>> = vec![None; plan.charges.len()];
        let charges_of = |indices: &[usize]| -> Vec<Charge> {
            indices
                .iter()
                .map(|&i| plan.charges[i].charge.clone())
                .collect()
        };
        let opened = self
            .counters
            .decide(&Consume {
                now_ms: plan.now_ms(),
                charges: &charges_of(&home_charges),
                commit: true,
                effects: &open,
            })
            .await;
        match opened {
            Ok(Decided::Fresh(evaluation)) => {
                place(&mut outcomes, &home_charges, &evaluation);
                if !evaluation.allowed {
                    // Nothing opened; the denial's entry (if any) is appended already.
                    return self.denied(plan, outcomes, &groups, None).await;
                }
            }
            Ok(replayed @ (Decided::Replayed { .. } | Decided::InFlight)) => return Ok(replayed),
            Ok(Decided::Refused) => {
                return Err(StoreError::Protocol("an open refused".to_owned()));
            }
            Err(error) => {
                let _ = self.abandon(home, &member, &record, None).await;
                return Err(error);
            }
        }
        for (i, group) in groups.iter().enumerate() {
            let reservation = Effects {
                reservation: Some(ReservationOpen {
                    key: keys::reservation(&self.prefix, group.shard, &member),
                    deadline_ms,
                    call_now_ms: self.now().timestamp_millis(),
                }),
                ..Effects::default()
            };
            let reserved = self
                .counters
                .decide(&Consume {
                    now_ms: plan.now_ms(),
                    charges: &charges_of(&group.charges),
                    commit: true,
                    effects: &reservation,
                })
                .await;
            let failure = match reserved {
                Ok(Decided::Fresh(evaluation)) if evaluation.allowed => {
                    place(&mut outcomes, &group.charges, &evaluation);
                    continue;
                }
                Ok(Decided::Fresh(evaluation)) => {
                    place(&mut outcomes, &group.charges, &evaluation);
                    self.abandon(home, &member, &record, denied_entry.clone())
                        .await?;
                    // Every other group is read again: their charges went back.
                    for earlier in
                        std::iter::once(&home_charges).chain(groups[..i].iter().map(|g| &g.charges))
                    {
                        for &index in earlier {
                            outcomes[index] = None;
                        }
                    }
                    return self
                        .denied(plan, outcomes, &groups, Some(&home_charges))
                        .await;
                }
                Ok(Decided::Refused) => {
                    StoreError::Timeout("the consume's deadline passed while reserving".into())
                }
                Ok(Decided::Replayed { .. } | Decided::InFlight) => {
                    StoreError::Protocol("a reservation replayed an answer".into())
                }
                Err(error) => error,
            };
            let _ = self.abandon(home, &member, &record, None).await;
            return Err(failure);
        }
        let evaluation = Evaluation {
            allowed: true,
            outcomes: outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| Outcome::empty(plan.now_ms())))
                .collect(),
        };
        let finalize = Finalize {
            intent,
            numbers: codec::reply_numbers(&evaluation),
            effects: Effects {
                idempotency: effects.idempotency.clone(),
                ledger: effects.ledger.clone(),
                hold: effects.hold.clone(),
                ..Effects::default()
            },
        };
        if crate::engine::faults::fault!(self, "crossslot.finalize") {
            let _ = self.abandon(home, &member, &record, None).await;
            return Err(StoreError::Timeout(
                "failpoint crossslot.finalize: the finalize was never sent".to_owned(),
            ));
        }
        let now_ms = self.now().timestamp_millis();
        match slots.finalize(now_ms, &finalize).await {
            Ok(Finalized::Committed) => Ok(Decided::Fresh(evaluation)),
            Ok(Finalized::Replayed(kept)) => {
                // A concurrent retry with the same key committed first: undo this one.
                self.abandon(home, &member, &record, None).await?;
                codec::decode_replay(&kept)
            }
            Ok(Finalized::Aborted) => {
                let _ = self.abandon(home, &member, &record, None).await;
                Err(StoreError::Timeout(
                    "the consume's deadline passed before it committed".into(),
                ))
            }
            // Committed, but too few replicas acknowledged it: in doubt, voided (never
            // answered 200 because the abandon finds it committed).
            Err(error @ StoreError::Unreplicated(_)) => Err(error),
            // The outcome is unknown: an intent that committed refuses the abandon.
            Err(error) => match self.abandon(home, &member, &record, None).await {
                Ok(true) => Ok(Decided::Fresh(evaluation)),
                _ => Err(error),
            },
        }
    }

    /// Reads `plan` (a check, or usage) one shard at a time: advisory, not one atomic
    /// read across the slots.
    pub(in crate::engine) async fn evaluate_across(
        &self,
        plan: &Plan,
    ) -> Result<Evaluation, StoreError> {
        let (home, groups) = groups(plan);
        let outcomes = vec![None; plan.charges.len()];
        let outcomes = self.read_rest(plan, outcomes, &groups, Some(&home)).await?;
        let allowed = plan
            .charges
            .iter()
            .zip(&outcomes)
            .all(|(planned, outcome)| outcome.allowed || !planned.charge.enforce);
        Ok(Evaluation { allowed, outcomes })
    }

    /// The denial's answer: the outcomes known, and the others read (charging nothing).
    async fn denied(
        &self,
        plan: &Plan,
        outcomes: Vec<Option<Outcome>>,
        groups: &[Group],
        home: Option<&Vec<usize>>,
    ) -> Result<Decided, StoreError> {
        let outcomes = self.read_rest(plan, outcomes, groups, home).await?;
        Ok(Decided::Fresh(Evaluation {
            allowed: false,
            outcomes,
        }))
    }

    /// Every outcome: those known, and the others read group by group (charging nothing).
    async fn read_rest(
        &self,
        plan: &Plan,
        mut outcomes: Vec<Option<Outcome>>,
        groups: &[Group],
        home: Option<&Vec<usize>>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut to_read: Vec<&Vec<usize>> = groups.iter().map(|g| &g.charges).collect();
        to_read.extend(home);
        for indices in to_read {
            if indices.iter().all(|&i| outcomes[i].is_some()) {
                continue;
            }
            let charges: Vec<Charge> = indices
                .iter()
                .map(|&i| plan.charges[i].charge.clone())
                .collect();
            let peek = self
                .counters
                .evaluate(plan.now_ms(), &charges, false)
                .await?;
            place(&mut outcomes, indices, &peek);
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Outcome::empty(plan.now_ms())))
            .collect())
    }

    /// Abandons the attempt `member` of home shard `home`: its intent (home charges given
    /// back once, `denied` appended), every foreign reservation undone once, then out of
    /// the index. `Ok(true)` when it had committed: then nothing is undone.
    async fn abandon(
        &self,
        home: u16,
        member: &str,
        record: &IntentRecord,
        denied: Option<String>,
    ) -> Result<bool, StoreError> {
        let now_ms = self.now().timestamp_millis();
        let intent_key = keys::intent(&self.prefix, home, member);
        let request = GiveBack {
            kind: GiveBackKind::Abandon,
            pending: None,
            reports_usage: false,
            control_key: intent_key.clone(),
            hold_index: None,
            counters: record.home.clone(),
            ledger: denied.map(|entry| (keys::ledger_stream(&self.prefix, home), entry)),
            idempotency: None,
        };
        if let GivenBack::Conflict(_) = self.counters.give_back(now_ms, &request).await? {
            return Ok(true);
        }
        for (shard, counters) in &record.foreign {
            let request = GiveBack {
                kind: GiveBackKind::Undo,
                pending: None,
                reports_usage: false,
                control_key: keys::reservation(&self.prefix, *shard, member),
                hold_index: None,
                counters: counters.clone(),
                ledger: None,
                idempotency: None,
            };
            self.counters.give_back(now_ms, &request).await?;
        }
        let resolved = resolved(&self.prefix, home, member);
        self.counters.give_back(now_ms, &resolved).await?;
        Ok(false)
    }

    /// Abandons the attempts whose deadline passed [`SKEW_MS`] ago (a crashed or stalled
    /// instance's), on every shard; returns how many were resolved. Only on a store that
    /// decides one slot per call, and only while some policy has shared budgets.
    pub(crate) async fn resolve_attempts(&self) -> usize {
        if !self.one_slot_per_call() || !self.cache.has_shared_budgets() {
            return 0;
        }
        let due = self.now().timestamp_millis() - SKEW_MS;
        let mut resolved = 0;
        for shard in 0..keys::SHARDS {
            let index = keys::intents_index(&self.prefix, shard);
            let Ok(members) = self.counters.expired_holds(&index, due, SWEEP_BATCH).await else {
                continue;
            };
            for member in members {
                if self.resolve(shard, &member).await.is_ok() {
                    resolved += 1;
                }
            }
        }
        resolved
    }

    /// Resolves one due attempt: abandoned unless it committed.
    async fn resolve(&self, shard: u16, member: &str) -> Result<(), StoreError> {
        let now_ms = self.now().timestamp_millis();
        let key = keys::intent(&self.prefix, shard, member);
        let record = match self.counters.record(&key, now_ms).await? {
            Some(text) => Some(codec::decode_intent(&text).map_err(StoreError::from)?),
            None => None,
        };
        match record {
            // A give-back whose share of other slots may not have been given: again, once.
            Some((state, record)) if state.starts_with("pending ") => {
                let mut parts = state.split(' ').skip(1);
                let full = parts.next() == Some("1");
                let by_amount: i64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let foreign = record.foreign.into_iter().collect();
                let share = (full, by_amount);
                self.restore_foreign(shard, member, foreign, share, &record.alerts)
                    .await?;
            }
            Some((state, record)) if state != "committed" => {
                self.abandon(shard, member, &record, None).await?;
            }
            // Committed, or long gone: only out of the index.
            _ => {
                let resolved = resolved(&self.prefix, shard, member);
                self.counters.give_back(now_ms, &resolved).await?;
            }
        }
        Ok(())
    }
}

/// The plan's charges at home, and the foreign groups in reservation order: the narrowest
/// budgets first (most scope keys), the widest (a global budget) last, then by shard.
fn groups(plan: &Plan) -> (Vec<usize>, Vec<Group>) {
    let mut home = Vec::new();
    let mut foreign: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, planned) in plan.charges.iter().enumerate() {
        match planned.charge.key.shard() {
            shard if shard != plan.keys.shard => foreign.entry(shard).or_default().push(i),
            _ => home.push(i),
        }
    }
    let mut groups: Vec<Group> = foreign
        .into_iter()
        .map(|(shard, charges)| Group { shard, charges })
        .collect();
    let width = |group: &Group| {
        group
            .charges
            .iter()
            .map(|&i| plan.charges[i].budget.iter().count())
            .min()
            .unwrap_or(0)
    };
    groups.sort_by_key(|g| (std::cmp::Reverse(width(g)), g.shard));
    (home, groups)
}

/// Puts a group's evaluation in the plan's charge order.
fn place(outcomes: &mut [Option<Outcome>], indices: &[usize], evaluation: &Evaluation) {
    for (&i, outcome) in indices.iter().zip(&evaluation.outcomes) {
        outcomes[i] = Some(*outcome);
    }
}
