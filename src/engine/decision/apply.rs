//! The one unit of work of every change to the counters: consume, hold and consume together
//! ([`Charging`]); refund, commit, release, expiry, over-capture and void
//! ([`GivingBack`]). Each passes through
//! [`Decider::apply`] in the same order: its invariants checked at the boundary, the cut
//! taken (a snapshot sees a change and its entries, or neither), then one store call, its
//! entries recorded or the change undone, and what a failed call may have applied handed
//! on to be voided. What differs between kinds is each kind's [`Change`] implementation.

use crate::domain::{CounterCharge, EntryId, LedgerEntry};
use crate::engine::decision::consume::{Attempt, Charged};
use crate::engine::decision::giveback::alerts::with_usage;
use crate::engine::decision::giveback::share_of;
use crate::engine::decision::plan::Plan;
use crate::engine::decision::Decider;
use crate::engine::store::{Decided, Effects, GiveBack, GivenBack, StoreError, Undo};
use crate::engine::EngineError;
use crate::keys;
use std::future::Future;

/// A change of the counters and its ledger entries, as one unit of work.
pub(in crate::engine) trait Change: Send + Sized {
    /// What the change answers.
    type Applied: Send;

    /// The unit's invariants (`decision::invariants`), checked before anything is changed:
    /// a violation stops the unit with [`EngineError::Broken`].
    fn check(&self) -> Result<(), EngineError>;

    /// Under the cut: the store call, the entries recorded (or the change undone), and
    /// what a failed call may have applied handed on to be voided.
    fn run(
        self,
        decider: &Decider,
    ) -> impl Future<Output = Result<Self::Applied, EngineError>> + Send;
}

impl Decider {
    /// Applies `change` as one unit of work (see the module's doc).
    pub(in crate::engine) async fn apply<C: Change>(
        &self,
        change: C,
    ) -> Result<C::Applied, EngineError> {
        change.check()?;
        // Until the entries are committed: a snapshot must see both or neither.
        let _cut = self.pipeline.change().await;
        change.run(self).await
    }
}

/// The unit of work of every consume, hold and consume together (`decision::apply`): `plan`'s
/// charges decided in one store call with `effects`, the `attempts`' entries recorded, and
/// the change undone if they cannot be (`engine::pipeline::unit`); a store failure answered
/// as the configuration says, with what Redis may have applied voided
/// (`engine::recovery::void`).
pub(in crate::engine) struct Charging<'a> {
    plan: &'a Plan,
    attempts: &'a [Attempt],
    effects: &'a Effects,
}

impl Change for Charging<'_> {
    type Applied = Charged;

    fn check(&self) -> Result<(), EngineError> {
        let charges = self.plan.charges.iter().map(|p| &p.charge);
        let entries = self.attempts.iter().map(|a| &a.allowed_entry);
        super::invariants::charged_as_planned(charges, entries)
    }

    async fn run(self, decider: &Decider) -> Result<Charged, EngineError> {
        let Self {
            plan,
            attempts,
            effects,
        } = self;
        // Copies of the entries, made only where they are written: on Redis the script
        // streamed them, and a copy per request would only cost the hot path.
        let allowed =
            || -> Vec<LedgerEntry> { attempts.iter().map(|a| a.allowed_entry.clone()).collect() };
        // A hold goes to the store even when no policy applies: its record must exist, so
        // that it can be settled.
        if plan.charges.is_empty() && effects.hold.is_none() {
            decider.pipeline.record(allowed()).await?;
            return Ok(Charged::Uncharged);
        }
        decider.pipeline.admit()?;
        let writes = decider.pipeline.commits_entries();
        let denies = attempts.iter().any(|a| a.denied_entry.is_some());
        let across = decider.slots_of(plan);
        // The attempt across slots (a Redis Cluster only): its id names its intent; its
        // counters are the plan's. Made only there: a copy of the entry per request costs
        // the hot path of every other deployment.
        let attempt = across.map(|_| match attempts {
            [one] => one.allowed_entry.clone(),
            many => LedgerEntry {
                id: EntryId::new(),
                counters: plan.counter_charges(),
                ..many[0].allowed_entry.clone()
            },
        });
        let decided = match (across, &attempt) {
            (Some(slots), Some(attempt)) => {
                decider.decide_across(slots, plan, effects, attempt).await
            }
            _ => decider.decide_waiting(plan, effects).await,
        };
        let decided = match decided {
            Ok(Decided::Fresh(_))
                if effects.ledger.is_some()
                    && crate::engine::faults::fault!(decider, "store.reply_lost") =>
            {
                Err(StoreError::Timeout(
                    "failpoint store.reply_lost: the reply was lost".to_owned(),
                ))
            }
            decided => decided,
        };
        match decided {
            Ok(Decided::Fresh(evaluation)) => {
                decider.pipeline.appended(evaluation.allowed || denies);
                match evaluation.allowed {
                    true => {
                        let answer = || decider.entry_answer(plan, effects, attempts, &evaluation);
                        let attempted = attempts.iter().map(|a| &a.allowed_entry);
                        let undo = || undo_charge(attempted.clone(), effects);
                        let entries = if writes { allowed() } else { Vec::new() };
                        decider
                            .pipeline
                            .commit_answered_or_undo(entries, plan.now_ms(), &answer, &undo)
                            .await?;
                    }
                    // A denial changed nothing: its entries (if kept) are only recorded.
                    false if writes && denies => {
                        let denied = attempts.iter().filter_map(|a| a.denied_entry.clone());
                        decider.pipeline.record_denied(denied.collect()).await?;
                    }
                    false => {}
                }
                Ok(Charged::Fresh(evaluation))
            }
            Ok(Decided::Replayed { record, evaluation }) => {
                Ok(Charged::Replayed { record, evaluation })
            }
            Ok(Decided::InFlight) => Ok(Charged::InFlight),
            Ok(Decided::Refused) => Err(EngineError::Store(StoreError::Protocol(
                "a consume was refused as a reservation".to_owned(),
            ))),
            Err(error) => {
                let intent = attempt.map(|attempt| {
                    keys::intent(&decider.prefix, plan.keys.shard, &attempt.id.to_string())
                });
                decider
                    .charge_failed(plan, effects, intent, allowed(), error)
                    .await
            }
        }
    }
}

impl Decider {
    /// A consume, hold or consume together as one unit of work: `plan`'s charges, with
    /// `effects`, for `attempts` (one, or the requests decided together).
    pub(in crate::engine) fn charging<'a>(
        &self,
        plan: &'a Plan,
        attempts: &'a [Attempt],
        effects: &'a Effects,
    ) -> Charging<'a> {
        Charging {
            plan,
            attempts,
            effects,
        }
    }

    /// Every give-back (a refund, a hold's settlement or expiry, a void) as one unit of
    /// work (`decision::apply`), `entry` at `home`: the entry keeps what tells the alert
    /// thresholds its `alerting` counters cross (none for a void), and `request_for` the
    /// entry so made is the store's request.
    pub(in crate::engine) fn giving_back(
        &self,
        home: u16,
        mut entry: LedgerEntry,
        alerting: Option<&[CounterCharge]>,
        request_for: impl FnOnce(&LedgerEntry) -> GiveBack,
    ) -> GivingBack {
        let reports_usage = alerting.is_some_and(|c| self.keep_alerts(&mut entry, c, home));
        let mut request = request_for(&entry);
        request.reports_usage = reports_usage;
        GivingBack {
            home,
            entry,
            request,
            alerting: alerting.is_some(),
        }
    }

    /// A consume's store call that failed with `error`, answered as the configuration says.
    /// Redis may have run a call that timed out or lost its connection (or ran it and too
    /// few replicas acknowledged it): if the answer is 503, each of the `allowed` entries'
    /// charges is voided once that is settled (engine::recovery::void), with the attempt's
    /// `intent` across slots.
    async fn charge_failed(
        &self,
        plan: &Plan,
        effects: &Effects,
        intent: Option<String>,
        allowed: Vec<LedgerEntry>,
        error: StoreError,
    ) -> Result<Charged, EngineError> {
        let in_doubt = effects.ledger.as_ref().filter(|_| may_have_run(&error));
        if let Err(answer) = self.on_store_failure(plan, error) {
            if let Some(ledger) = in_doubt {
                let key = effects.idempotency.as_ref().map(|i| i.key.clone());
                for entry in &allowed {
                    self.followup
                        .doubt(entry, &ledger.stream, key.clone(), intent.clone());
                }
            }
            return Err(answer);
        }
        // Failing open: accepted uncounted, but never unrecorded: with the ledger down too,
        // it is answered 503.
        self.pipeline.record(allowed).await?;
        Ok(Charged::Degraded)
    }

    /// Writes `entry` to the SQL ledger before the answer, unless the store streamed it;
    /// if it cannot be, the give-back `request` (which answered a refunded total and what
    /// each counter got back) is undone.
    async fn record_unless_streamed(
        &self,
        entry: &LedgerEntry,
        request: &GiveBack,
        (refunded, restored): (u64, Vec<i64>),
    ) -> Result<(), EngineError> {
        let undo = || Undo::GiveBack {
            request: Box::new(request.clone()),
            refunded,
            restored: restored.clone(),
        };
        self.pipeline
            .commit_or_undo(vec![entry.clone()], entry.at.timestamp_millis(), &undo)
            .await
    }
}

/// What undoes the charges `entries` record, with their `effects` (kept answer, hold).
fn undo_charge<'a>(entries: impl Iterator<Item = &'a LedgerEntry>, effects: &Effects) -> Undo {
    Undo::Charge {
        counters: entries.flat_map(|e| e.counters.clone()).collect(),
        idempotency: effects.idempotency.as_ref().map(|idem| idem.key.clone()),
        hold: effects.hold.as_ref().map(|hold| {
            (
                hold.record_key.clone(),
                (hold.index_key.clone(), hold.hold_id.clone()),
            )
        }),
    }
}

/// Whether a failed store call may have been run by Redis all the same: it timed out, its
/// connection broke, or it ran and too few replicas acknowledged it.
fn may_have_run(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::Unreplicated(_)
    )
}

/// A give-back as one unit of work ([`Decider::giving_back`]): the share of other Redis
/// Cluster slots is kept pending at home, the store applies the rest, the share goes to the
/// other slots, and the entry is committed (or the give-back undone). Applied, it answers the
/// entry and the store's answer; nothing but a [`GivenBack::Done`] changed anything.
pub(in crate::engine) struct GivingBack {
    home: u16,
    entry: LedgerEntry,
    request: GiveBack,
    /// Whether the entry tells the alert thresholds it crosses (not a void's).
    alerting: bool,
}

impl Change for GivingBack {
    type Applied = (LedgerEntry, GivenBack);

    fn check(&self) -> Result<(), EngineError> {
        // Before the share of other Redis Cluster slots leaves the request.
        super::invariants::given_within_charged(&self.request, &self.entry)
    }

    async fn run(self, decider: &Decider) -> Result<(LedgerEntry, GivenBack), EngineError> {
        let Self {
            home,
            mut entry,
            mut request,
            alerting,
        } = self;
        let foreign = decider.foreign_share(home, &mut request);
        let foreign_alerts = match alerting {
            true => decider.foreign_alerts(&entry, &foreign),
            false => Vec::new(),
        };
        request.pending = decider.pending_share(home, &entry, &foreign, &foreign_alerts);
        let given = decider
            .counters
            .give_back(entry.at.timestamp_millis(), &request)
            .await?;
        if let GivenBack::Done {
            refunded,
            restored,
            usage,
        } = &given
        {
            entry = with_usage(entry, usage);
            let share = share_of(request.kind, *refunded);
            decider
                .share_foreign(home, &entry, foreign, share, foreign_alerts)
                .await;
            decider
                .record_unless_streamed(&entry, &request, (*refunded, restored.clone()))
                .await?;
        }
        Ok((entry, given))
    }
}
