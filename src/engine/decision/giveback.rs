//! Giving quota back: refunds of consumes, and the settlement, release and expiry of holds.
//! Each is one atomic counter-store call that restores the counters the charge went to
//! (where they still count), checks and updates the bookkeeping, and appends the ledger entry.

use crate::domain::{
    ActionSet, CounterCharge, EntryId, EntryKind, HoldId, LedgerEntry, PolicyAmount, Quantity,
};
use crate::engine::codec::{self, HoldRecord};
use crate::engine::decision::Decider;
use crate::engine::store::{signed, GiveBack, GiveBackKind, GivenBack, StoreError};
use crate::engine::{Decision, EngineError};
use crate::keys;
use crate::logs::Throttle;
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicI64, Ordering};

pub(super) mod alerts;
mod refund;
use alerts::give_back_kept;

/// When the first hold known to this instance falls due, per shard: the holds it opened,
/// and those the janitor's look found. Only shards with a hold due are swept.
#[derive(Debug)]
pub(crate) struct HoldDues([AtomicI64; keys::SHARDS as usize]);

impl Default for HoldDues {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicI64::new(i64::MAX)))
    }
}

impl HoldDues {
    /// A hold of `shard` falls due at `at_ms`.
    pub(crate) fn expect(&self, shard: u16, at_ms: i64) {
        if let Some(due) = self.0.get(usize::from(shard)) {
            due.fetch_min(at_ms, Ordering::AcqRel);
        }
    }

    /// The shards with a hold due at `now_ms`, forgotten (the sweep learns the next).
    fn take_due(&self, now_ms: i64) -> Vec<u16> {
        (0..keys::SHARDS)
            .filter(|&shard| {
                let due = &self.0[usize::from(shard)];
                due.load(Ordering::Acquire) <= now_ms
                    && due.swap(i64::MAX, Ordering::AcqRel) <= now_ms
            })
            .collect()
    }
}

/// The answer to a refund or a settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The ledger entry written.
    pub(crate) entry: LedgerEntry,
    /// Current usage of the action's policies for the subject, after it.
    pub(crate) usage: Option<Decision>,
    /// True when this replays an earlier refund with the same idempotency key.
    pub(crate) replayed: bool,
}

/// How to settle a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Keep `amount` (default: all of it); the rest goes back. With `over_capture`, the
    /// amount may exceed the hold: the excess is charged to every amount policy the hold
    /// charged, past its limit if need be.
    Commit {
        /// What to keep.
        amount: Option<Quantity>,
        /// Whether more than the hold may be kept.
        over_capture: bool,
    },
    /// Give it all back.
    Release,
}

/// Per-policy amounts given back: amount policies get `by_amount` (at most what they were
/// charged), count policies their charge when `full`.
pub(in crate::engine) fn given(
    counters: &[CounterCharge],
    by_amount: u64,
    full: bool,
) -> Vec<PolicyAmount> {
    counters
        .iter()
        .map(|c| PolicyAmount {
            policy_id: c.policy_id.clone(),
            amount: match (c.by_amount, full) {
                (true, _) => by_amount.min(c.charged),
                (false, true) => c.charged,
                (false, false) => 0,
            },
            scope: c.scope.clone(),
        })
        .filter(|p| p.amount > 0)
        .collect()
}

/// The counters an over-capture's `excess` goes to: every amount policy's counter of the
/// hold, charged the excess (count policies keep their one charge).
fn over_captured(counters: &[CounterCharge], excess: u64) -> Vec<CounterCharge> {
    counters
        .iter()
        .filter(|c| c.by_amount)
        .map(|c| CounterCharge {
            charged: excess,
            ..c.clone()
        })
        .collect()
}

/// The per-policy amounts `counters` were charged.
fn charged_to(counters: &[CounterCharge]) -> Vec<PolicyAmount> {
    counters
        .iter()
        .map(|c| PolicyAmount {
            policy_id: c.policy_id.clone(),
            amount: c.charged,
            scope: c.scope.clone(),
        })
        .collect()
}

/// What a give-back of `kind` gives back to the counters of other Redis Cluster slots:
/// `(full, by_amount)` (count policies their charge when `full`; amount policies
/// `by_amount`, below zero what an over-capture charges more). `refunded` is the refunded
/// total after a refund: the last one gives count policies theirs back.
pub(super) fn share_of(kind: GiveBackKind, refunded: u64) -> (bool, i64) {
    match kind {
        GiveBackKind::Refund { amount, total, .. } => (refunded == total, signed(amount)),
        GiveBackKind::Commit { settle, total, .. } => (false, signed(total) - signed(settle)),
        GiveBackKind::Release { total, .. }
        | GiveBackKind::Expire { total, .. }
        | GiveBackKind::Void { total }
        | GiveBackKind::VoidHold { total, .. } => (true, signed(total)),
        GiveBackKind::Abandon
        | GiveBackKind::Undo
        | GiveBackKind::Resolved
        | GiveBackKind::RestoreOnce { .. } => (false, 0),
    }
}

impl Decider {
    /// Commits or releases the hold `hold_id`. A hold of an action outside `visible` is
    /// unknown to the caller: not found, and nothing changes.
    pub(crate) async fn settle(
        &self,
        hold_id: HoldId,
        how: Settle,
        visible: &ActionSet,
    ) -> Result<Settled, EngineError> {
        let not_found = || EngineError::NotFound(format!("no hold '{hold_id}'"));
        if hold_id.shard() >= keys::SHARDS {
            return Err(not_found());
        }
        let record = self
            .hold_record(hold_id)
            .await?
            .filter(|record| visible.contains(&record.action))
            .ok_or_else(not_found)?;
        match self.give_hold_back(hold_id, &record, Some(how)).await? {
            (entry, GivenBack::Done { .. }) => Ok(self.settled(entry, false).await),
            (_, GivenBack::Conflict(state)) => Err(EngineError::Conflict(format!(
                "hold '{hold_id}' is {state}"
            ))),
            _ => Err(not_found()),
        }
    }

    /// Releases every expired hold of every shard; returns how many.
    pub(crate) async fn expire_due_holds(&self) -> usize {
        self.expire_holds_of(0..keys::SHARDS).await
    }

    /// Releases the expired holds of the shards where one is known to be due (opened by
    /// this instance, or seen by [`Decider::look_for_holds`]); then learns when each of
    /// those shards' next hold falls due. Runs every half second: with nothing due it
    /// costs the store nothing.
    pub(crate) async fn expire_scheduled_holds(&self) -> usize {
        let now_ms = self.now().timestamp_millis();
        let due = self.hold_dues.take_due(now_ms);
        let expired = self.expire_holds_of(due.iter().copied()).await;
        for shard in due {
            let index = keys::holds_index(&self.prefix, shard);
            match self.counters.next_due(&index).await {
                Ok(Some(at_ms)) => self.hold_dues.expect(shard, at_ms),
                Ok(None) => {}
                // Look again at the next tick.
                Err(_) => self.hold_dues.expect(shard, now_ms),
            }
        }
        expired
    }

    /// The janitor's look at every shard's holds (those of instances that died among
    /// them): when the first falls due.
    pub(crate) async fn look_for_holds(&self) {
        for shard in 0..keys::SHARDS {
            let index = keys::holds_index(&self.prefix, shard);
            if let Ok(Some(at_ms)) = self.counters.next_due(&index).await {
                self.hold_dues.expect(shard, at_ms);
            }
        }
    }

    /// Releases the expired holds of `shards`; returns how many.
    async fn expire_holds_of(&self, shards: impl IntoIterator<Item = u16>) -> usize {
        let mut expired = 0;
        for shard in shards {
            let index = keys::holds_index(&self.prefix, shard);
            let now_ms = self.now().timestamp_millis();
            let due = match self.counters.expired_holds(&index, now_ms, 100).await {
                Ok(due) => due,
                Err(error) => {
                    tracing::warn!(error = %error, "listing expired holds failed");
                    return expired;
                }
            };
            for member in due {
                if crate::engine::faults::fault!(self, "sweep.expire") {
                    continue;
                }
                match self.expire_hold(shard, &member).await {
                    Ok(true) => expired += 1,
                    Ok(false) => {}
                    Err(error) => {
                        static SITE: Throttle = Throttle::new();
                        if let Some(count) = SITE.event() {
                            tracing::warn!(error = %error, hold_id = member, count, "expiring a hold failed");
                        }
                    }
                }
            }
        }
        expired
    }

    /// Gives back the hold `member` of `shard`'s index; false if it was settled already,
    /// or is unknown (then its index entry is dropped).
    async fn expire_hold(&self, shard: u16, member: &str) -> Result<bool, EngineError> {
        let record = match HoldId::parse(member) {
            Ok(hold_id) => self
                .hold_record(hold_id)
                .await?
                .map(|record| (hold_id, record)),
            Err(_) => None,
        };
        let Some((hold_id, record)) = record else {
            self.forget_hold(shard, member).await?;
            return Ok(false);
        };
        let (_, done) = self.give_hold_back(hold_id, &record, None).await?;
        Ok(matches!(done, GivenBack::Done { .. }))
    }

    /// The hold's record, if the store has it. One that does not parse is an error (500),
    /// never taken for a missing hold: that would keep its quota charged for good.
    async fn hold_record(&self, hold_id: HoldId) -> Result<Option<HoldRecord>, EngineError> {
        let key = keys::hold_record(&self.prefix, hold_id.shard(), &hold_id.to_string());
        let now_ms = self.now().timestamp_millis();
        match self.counters.record(&key, now_ms).await? {
            None => Ok(None),
            Some(text) => Ok(Some(
                codec::decode_hold_record(&text).map_err(StoreError::from)?,
            )),
        }
    }

    /// Drops `member` from `shard`'s index of open holds: it has no record (long gone).
    async fn forget_hold(&self, shard: u16, member: &str) -> Result<(), EngineError> {
        let request = GiveBack {
            kind: GiveBackKind::Expire {
                total: 0,
                expires_at_ms: 0,
            },
            pending: None,
            reports_usage: false,
            control_key: keys::hold_record(&self.prefix, shard, member),
            hold_index: Some((keys::holds_index(&self.prefix, shard), member.to_owned())),
            counters: Vec::new(),
            ledger: None,
            idempotency: None,
        };
        let now_ms = self.now().timestamp_millis();
        let _cut = self.pipeline.change().await;
        self.counters.give_back(now_ms, &request).await?;
        Ok(())
    }

    /// Settles (`how`) or expires (`None`) a hold; returns the entry and the result.
    async fn give_hold_back(
        &self,
        hold_id: HoldId,
        record: &HoldRecord,
        how: Option<Settle>,
    ) -> Result<(LedgerEntry, GivenBack), EngineError> {
        let (entry, request) = self.hold_give_back(hold_id, record, how, self.now())?;
        let alerting = Some(record.counters.as_slice());
        let giving = self.giving_back(hold_id.shard(), entry, alerting, |entry| GiveBack {
            ledger: self.pipeline.stream_entry(hold_id.shard(), entry),
            ..request
        });
        self.apply(giving).await
    }

    /// The entry and the store's request that settle (`how`) or expire (`None`) a hold at
    /// `now`; a commit of more than the hold holds is a conflict, unless it over-captures:
    /// then the entry records the excess as charged to each amount policy of the hold
    /// (its `policies`, and its `counters` for rebuilds).
    pub(in crate::engine) fn hold_give_back(
        &self,
        hold_id: HoldId,
        record: &HoldRecord,
        how: Option<Settle>,
        now: DateTime<Utc>,
    ) -> Result<(LedgerEntry, GiveBack), EngineError> {
        let (total, expires_at_ms) = (record.amount, record.expires_at_ms);
        let mut excess_counters = Vec::new();
        let (kind, entry_kind, entry_amount, policies) = match how {
            Some(Settle::Commit {
                amount,
                over_capture,
            }) => {
                let settle = amount.map_or(total, Quantity::get);
                if settle > total && !over_capture {
                    return Err(EngineError::Conflict(format!(
                        "hold '{hold_id}' holds {total}; cannot commit {settle} \
                         (over_capture: true keeps more than was held)"
                    )));
                }
                let kind = GiveBackKind::Commit {
                    settle,
                    total,
                    expires_at_ms,
                };
                let policies = match settle.checked_sub(total) {
                    Some(excess) if excess > 0 => {
                        excess_counters = over_captured(&record.counters, excess);
                        charged_to(&excess_counters)
                    }
                    _ => given(&record.counters, total - settle, false),
                };
                (kind, EntryKind::Commit, settle, policies)
            }
            Some(Settle::Release) => (
                GiveBackKind::Release {
                    total,
                    expires_at_ms,
                },
                EntryKind::Release,
                total,
                given(&record.counters, total, true),
            ),
            None => (
                GiveBackKind::Expire {
                    total,
                    expires_at_ms,
                },
                EntryKind::Expire,
                total,
                given(&record.counters, total, true),
            ),
        };
        let entry = LedgerEntry {
            folded: Vec::new(),
            id: EntryId::new(),
            at: now,
            kind: entry_kind,
            action: record.action.clone(),
            subject: record.subject.clone(),
            amount: entry_amount,
            consumption_id: None,
            hold_id: Some(hold_id),
            idempotency_key: None,
            policies,
            attributes: record.attributes.clone(),
            counters: excess_counters,
            hold_expires_at: None,
            kept_answer: None,
            totals: Vec::new(),
        };
        let (shard, member) = (hold_id.shard(), hold_id.to_string());
        let request = GiveBack {
            kind,
            pending: None,
            reports_usage: false,
            control_key: keys::hold_record(&self.prefix, shard, &member),
            hold_index: Some((keys::holds_index(&self.prefix, shard), member)),
            counters: record.counters.clone(),
            ledger: self.pipeline.stream_entry(shard, &entry),
            idempotency: None,
        };
        Ok((entry, request))
    }

    /// Gives `entry`'s share back to the foreign shards of a Redis Cluster (see
    /// [`Decider::restore_foreign`]): `(full, by_amount)`, with the shards' `alerts`
    /// ([`Decider::foreign_alerts`]). The entry is recorded already, with a pending record
    /// at `home`: a failure here is logged, the answer stands, and the sweeper gives the
    /// share back later.
    pub(in crate::engine) async fn share_foreign(
        &self,
        home: u16,
        entry: &LedgerEntry,
        foreign: std::collections::BTreeMap<u16, Vec<CounterCharge>>,
        (full, by_amount): (bool, i64),
        alerts: Vec<(u16, String)>,
    ) {
        if foreign.is_empty() {
            return;
        }
        let id = entry.id.to_string();
        if let Err(error) = self
            .restore_foreign(home, &id, foreign, (full, by_amount), &alerts)
            .await
        {
            static SITE: Throttle = Throttle::new();
            if let Some(count) = SITE.event() {
                tracing::warn!(error = %error, entry_id = %entry.id, count,
                    "giving back to a shared budget's slot failed; the sweeper will");
            }
        }
    }

    /// Makes `entry`, a give-back of a charge to `counters`, keep what tells the alert
    /// thresholds it crosses (`give_back_kept`) when a policy of its action
    /// alerts; whether it does (the store then reports the usage it leaves). Only the
    /// counters of `home` count: those of other slots of a Redis Cluster are given back
    /// in a second step, which tells theirs (`foreign_alerts`).
    pub(super) fn keep_alerts(
        &self,
        entry: &mut LedgerEntry,
        counters: &[CounterCharge],
        home: u16,
    ) -> bool {
        let home: Vec<CounterCharge> = counters
            .iter()
            .filter(|c| self.at_home(home, c))
            .cloned()
            .collect();
        entry.kept_answer = self
            .cache
            .action(entry.action.as_str())
            .and_then(|policies| give_back_kept(&policies, entry, &home));
        entry.kept_answer.is_some()
    }

    /// What tells the alert thresholds that `entry`'s share in each of the `foreign`
    /// shards crosses, per shard whose counters alert: the entry (compact) keeping their
    /// policies, to which the shard's usage report is appended (`restore_foreign`).
    pub(in crate::engine) fn foreign_alerts(
        &self,
        entry: &LedgerEntry,
        foreign: &std::collections::BTreeMap<u16, Vec<CounterCharge>>,
    ) -> Vec<(u16, String)> {
        let Some(policies) = self
            .cache
            .action(entry.action.as_str())
            .filter(|_| !foreign.is_empty())
        else {
            return Vec::new();
        };
        foreign
            .iter()
            .filter_map(|(shard, counters)| {
                let kept = give_back_kept(&policies, entry, counters)?;
                let told = LedgerEntry {
                    folded: Vec::new(),
                    kept_answer: Some(kept),
                    ..entry.clone()
                };
                Some((*shard, codec::encode_entry(&told)))
            })
            .collect()
    }

    /// The answer to a give-back: its entry, with the subject's usage after it.
    async fn settled(&self, entry: LedgerEntry, replayed: bool) -> Settled {
        let usage = self
            .usage(&entry.action, &entry.subject, &entry.attributes)
            .await
            .ok();
        Settled {
            entry,
            usage,
            replayed,
        }
    }
}

#[cfg(test)]
mod hold_due_tests {
    use super::HoldDues;

    #[test]
    fn a_shard_is_due_once_its_first_hold_is_and_then_forgotten_until_told_again() {
        let dues = HoldDues::default();
        assert!(dues.take_due(i64::MAX - 1).is_empty(), "nothing known");
        dues.expect(3, 2_000);
        dues.expect(3, 1_000);
        dues.expect(7, 5_000);
        assert!(
            dues.take_due(999).is_empty(),
            "the first of shard 3 is at 1000"
        );
        assert_eq!(dues.take_due(1_000), vec![3]);
        assert!(
            dues.take_due(4_000).is_empty(),
            "taken: its sweep learns the next from the store"
        );
        assert_eq!(dues.take_due(5_000), vec![7]);
    }
}
