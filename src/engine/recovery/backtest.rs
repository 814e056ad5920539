//! Backtests: a policy change tried on the recorded past.
//!
//! The ledger holds every request the service decided (charges, holds and, where recorded,
//! denials) with its time, attributes and amount, and everything that gave quota back
//! (refunds, settlements, expiries). A backtest replays an interval of it, in the order the
//! rebuild replays (`recovery::rebuild::Replayer`), through the live decision code (the
//! plan, and the in-process counter store's arithmetic) against other policies, starting
//! from empty counters: a fresh in-process store (the engine's scratch store, as `counters
//! verify` uses), never the live counters, and nothing is
//! written to the ledger. A request the replay denies charges nothing; a refund or
//! settlement of one it denied (or of one made before the interval) is passed over.
//!
//! A backtest replays entries only. A consume recorded in the ledger's totals (its
//! policies `record: totals`) is no entry of the ledger's API: it is passed over, and
//! counted per policy of its action as `in_totals`, so that the answer says what it
//! did not see.

use crate::domain::{
    Action, Budget, ConsumptionId, EntryKind, HoldId, LedgerEntry, Policy, PolicyId, Quantity,
};
use crate::engine::codec::{self, HoldRecord};
use crate::engine::decision::plan::{plan_in, Plan};
use crate::engine::decision::policies::PolicyCache;
use crate::engine::recovery::pages::Pages;
use crate::engine::recovery::rebuild::{settlement, Replayer, PAGE, REORDER};
use crate::engine::recovery::Recovery;
use crate::engine::state::{Replay, ReplayOp};
use crate::engine::store::{Evaluation, StoreError};
use crate::engine::{ConsumeRequest, EngineError};
use crate::keys;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};

/// The longest interval a backtest replays.
pub const MAX_DAYS: i64 = 31;
/// The most policies one backtest takes.
pub const MAX_POLICIES: usize = 32;
/// How many budgets `top_denied` names.
const TOP_DENIED: usize = 10;
/// Entries replayed between two yields to the other tasks of the thread.
const YIELD_EVERY: u64 = 512;

/// What a backtest found for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyOutcome {
    /// The policy.
    pub policy_id: PolicyId,
    /// The replayed requests it applied to.
    pub requests: u64,
    /// Those it denied (a shadow policy: would have denied).
    pub denied: u64,
    /// Those it denied that were allowed live.
    pub newly_denied: u64,
    /// Those denied live that the replay allowed.
    pub newly_allowed: u64,
    /// The budget that reached the highest usage, with it and its limit.
    pub peak: Option<(Budget, u64, u64)>,
    /// The budgets it denied most, with how many (at most 10, most first).
    pub top_denied: Vec<(Budget, u64)>,
    /// The requests of its action in the interval that were recorded in the ledger's
    /// totals (`record: totals`): not replayed, nor counted in `requests`.
    pub in_totals: u64,
}

/// A backtest's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backtest {
    /// Per policy, in the order given.
    pub policies: Vec<PolicyOutcome>,
    /// The ledger entries replayed.
    pub entries: u64,
}

/// One policy's running figures.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    denied: u64,
    newly_denied: u64,
    newly_allowed: u64,
    peak: Option<(Budget, u64, u64)>,
    denied_by_budget: HashMap<String, (Budget, u64)>,
}

/// The state of one replay.
struct Run<'a> {
    engine: &'a Recovery,
    cache: PolicyCache,
    /// A fresh in-process store (the engine's scratch store).
    store: std::sync::Arc<dyn Replay>,
    from: DateTime<Utc>,
    /// Consumes the replay denied: their refunds are passed over.
    denied: HashSet<ConsumptionId>,
    /// Holds the replay opened and has not settled.
    holds: HashMap<HoldId, HoldRecord>,
    /// Refunded so far in the replay, per consumption.
    refunded: HashMap<ConsumptionId, u64>,
    tallies: HashMap<PolicyId, Tally>,
    entries: u64,
}

/// The net count of requests a row recorded in the ledger's totals stands for: 1 for a
/// consume, -1 for the void of one, and for a folded row the consumes it folds.
fn totals_requests(entry: &LedgerEntry) -> i64 {
    if !entry.folded.is_empty() {
        return i64::try_from(entry.folded.len()).unwrap_or(i64::MAX);
    }
    entry
        .totals
        .first()
        .map_or(0, |line| line.allowed.saturating_add(line.denied))
}

impl Recovery {
    /// Replays the ledger's entries made in `[from, to)` for the actions of `policies`
    /// against `policies` (see the module). The caller checks the limits.
    pub(crate) async fn backtest(
        &self,
        mut policies: Vec<Policy>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Backtest, EngineError> {
        let order: Vec<(PolicyId, Action)> = policies
            .iter()
            .map(|p| (p.id.clone(), p.spec.action.clone()))
            .collect();
        let mut in_totals: HashMap<Action, i64> = HashMap::new();
        let actions: HashSet<Action> = policies.iter().map(|p| p.spec.action.clone()).collect();
        policies.sort_by(|a, b| a.id.cmp(&b.id));
        let cache = PolicyCache::new();
        cache.install(0, policies, Vec::new());
        let mut run = Run {
            engine: self,
            cache,
            store: (self.scratch)(),
            from,
            denied: HashSet::new(),
            holds: HashMap::new(),
            refunded: HashMap::new(),
            tallies: HashMap::new(),
            entries: 0,
        };
        let mut replayer = Replayer::default();
        if let Some(first) = self.ledger.first_seq_since(from).await? {
            // Entries are inserted a little out of the order they were made in: read on
            // until as many as the replay reorders were made after `to`.
            let mut past_end = 0;
            // One action (the usual backtest): only its entries are read, through its index.
            let only = match actions.iter().collect::<Vec<_>>()[..] {
                [one] => Some(one.clone()),
                _ => None,
            };
            let mut pages = Pages::after(self.ledger.clone(), first - 1, PAGE, only);
            while past_end <= REORDER {
                let page = pages.next().await?;
                if page.is_empty() {
                    break;
                }
                for (_, entry) in page {
                    if entry.at >= to {
                        past_end += 1;
                    } else if entry.at >= from && actions.contains(&entry.action) {
                        match entry.totals.is_empty() {
                            true => replayer.wait(entry),
                            false => {
                                *in_totals.entry(entry.action.clone()).or_default() +=
                                    totals_requests(&entry);
                            }
                        }
                    }
                }
                while replayer.waiting() > REORDER {
                    run.next(&mut replayer).await?;
                }
            }
        }
        while replayer.waiting() > 0 {
            run.next(&mut replayer).await?;
        }
        let mut tallies = run.tallies;
        let entries = run.entries;
        let policies = order
            .into_iter()
            .map(|(id, action)| {
                let tally = tallies.remove(&id).unwrap_or_default();
                let skipped = in_totals.get(&action).copied().unwrap_or(0);
                outcome(id, tally, u64::try_from(skipped).unwrap_or(0))
            })
            .collect();
        Ok(Backtest { policies, entries })
    }
}

/// A policy's answer from its tally.
fn outcome(policy_id: PolicyId, tally: Tally, in_totals: u64) -> PolicyOutcome {
    let mut top: Vec<(Budget, u64)> = tally.denied_by_budget.into_values().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.text().cmp(&b.0.text())));
    top.truncate(TOP_DENIED);
    PolicyOutcome {
        policy_id,
        requests: tally.requests,
        denied: tally.denied,
        newly_denied: tally.newly_denied,
        newly_allowed: tally.newly_allowed,
        peak: tally.peak,
        top_denied: top,
        in_totals,
    }
}

/// The request `entry` (a charge, hold or denial) recorded.
fn request_of(entry: &LedgerEntry) -> Result<ConsumeRequest, EngineError> {
    Ok(ConsumeRequest {
        action: entry.action.clone(),
        subject: entry.subject.clone(),
        amount: Quantity::parse("amount", i128::from(entry.amount))
            .map_err(|e| StoreError::Protocol(e.to_string()))?,
        idempotency_key: None,
        attributes: entry.attributes.clone(),
        anonymous: false,
    })
}

impl Run<'_> {
    /// Replays the next entry waiting in `replayer`.
    async fn next(&mut self, replayer: &mut Replayer) -> Result<(), EngineError> {
        let Some(entry) = replayer.next() else {
            return Ok(());
        };
        self.entries += 1;
        if self.entries.is_multiple_of(YIELD_EVERY) {
            tokio::task::yield_now().await;
        }
        match entry.kind {
            EntryKind::Charge | EntryKind::Hold | EntryKind::Deny => self.request(&entry).await,
            EntryKind::Refund => self.refund(&entry).await,
            EntryKind::Void if entry.consumption_id.is_some() => self.refund(&entry).await,
            EntryKind::Commit | EntryKind::Release | EntryKind::Expire | EntryKind::Void => {
                self.settle(&entry).await
            }
        }
    }

    /// A recorded request, decided again under the backtest's policies.
    async fn request(&mut self, entry: &LedgerEntry) -> Result<(), EngineError> {
        let request = request_of(entry)?;
        // A request the new policies find invalid (an attribute a scope needs is missing)
        // would have been refused, charging nothing.
        let Ok(plan) = plan_in(&self.cache, &self.engine.prefix, &request, entry.at) else {
            return Ok(());
        };
        let at_ms = entry.at.timestamp_millis();
        let evaluation = self
            .store
            .evaluate(at_ms, &plan.store_charges(), true)
            .await?;
        self.count(&plan, &evaluation, entry.kind != EntryKind::Deny);
        match (entry.kind, evaluation.allowed) {
            (EntryKind::Charge, false) => {
                self.denied.extend(entry.consumption_id);
            }
            (EntryKind::Hold, true) => {
                let (Some(hold_id), Some(expires_at)) = (entry.hold_id, entry.hold_expires_at)
                else {
                    return Ok(());
                };
                let record = HoldRecord {
                    action: entry.action.clone(),
                    subject: entry.subject.clone(),
                    amount: entry.amount,
                    expires_at_ms: expires_at.timestamp_millis(),
                    counters: plan.counter_charges(),
                    attributes: entry.attributes.clone(),
                };
                let key =
                    keys::hold_record(&self.engine.prefix, hold_id.shard(), &hold_id.to_string());
                let op = ReplayOp::Record {
                    key,
                    text: format!("open\n{}", codec::encode_hold_record(&record)),
                    expires_at_ms: i64::MAX,
                };
                self.store.replay(vec![op]).await?;
                self.holds.insert(hold_id, record);
            }
            _ => {}
        }
        Ok(())
    }

    /// Each applying policy's figures for one decision (`live`: whether it was allowed).
    fn count(&mut self, plan: &Plan, evaluation: &Evaluation, live: bool) {
        for (planned, outcome) in plan.charges.iter().zip(&evaluation.outcomes) {
            let policy = &plan.policies.enabled[planned.policy];
            let tally = self.tallies.entry(policy.id.clone()).or_default();
            tally.requests += 1;
            if !outcome.allowed {
                tally.denied += 1;
                tally.newly_denied += u64::from(live);
                let text = planned.budget.text();
                tally
                    .denied_by_budget
                    .entry(text)
                    .or_insert_with(|| (planned.budget.clone(), 0))
                    .1 += 1;
            }
            if evaluation.allowed {
                tally.newly_allowed += u64::from(!live);
                let higher = tally
                    .peak
                    .as_ref()
                    .is_none_or(|(_, used, _)| outcome.used > *used);
                if higher {
                    tally.peak = Some((planned.budget.clone(), outcome.used, planned.charge.limit));
                }
            }
        }
    }

    /// A refund (or void) of a consume the replay charged, given back as it was.
    async fn refund(&mut self, entry: &LedgerEntry) -> Result<(), EngineError> {
        let Some(consumption_id) = entry.consumption_id else {
            return Ok(());
        };
        if self.denied.contains(&consumption_id) {
            return Ok(());
        }
        let Some(mut charge) = self.engine.ledger.charge_of(consumption_id).await? else {
            return Ok(());
        };
        if charge.at < self.from {
            return Ok(());
        }
        let Ok(plan) = plan_in(
            &self.cache,
            &self.engine.prefix,
            &request_of(&charge)?,
            charge.at,
        ) else {
            return Ok(());
        };
        charge.counters = plan.counter_charges();
        let refunded = self.refunded.get(&consumption_id).copied().unwrap_or(0);
        let mut request = self
            .engine
            .decider
            .refund_give_back(&charge, entry, refunded);
        request.ledger = None;
        request.idempotency = None;
        self.store
            .give_back(entry.at.timestamp_millis(), &request)
            .await?;
        self.refunded
            .insert(consumption_id, refunded.saturating_add(entry.amount));
        Ok(())
    }

    /// A settlement or expiry of a hold the replay opened.
    async fn settle(&mut self, entry: &LedgerEntry) -> Result<(), EngineError> {
        let Some(record) = entry.hold_id.and_then(|id| self.holds.remove(&id)) else {
            return Ok(());
        };
        let how = settlement(entry)?;
        let Some(hold_id) = entry.hold_id else {
            return Ok(());
        };
        let (_, mut request) = self
            .engine
            .decider
            .hold_give_back(hold_id, &record, how, entry.at)?;
        request.ledger = None;
        self.store
            .give_back(entry.at.timestamp_millis(), &request)
            .await?;
        Ok(())
    }
}
