//! Voiding: a consume or hold answered 503 that Redis decided all the same.
//!
//! A Redis call that times out (or whose connection breaks) may still have run: Redis may
//! have charged the consume and appended its entry after the caller stopped waiting, and
//! answered a client who got 503. Every state-changing call carries the moment its caller
//! stops waiting; `consume.lua` refuses to run later than that plus [`CLOCK_SKEW_MS`] by
//! Redis's own clock. So once this instance's wall clock is past that moment plus the skew
//! twice, the call has run or never will:
//!
//! 1. the attempt is **registered** as in doubt when its answer is 503 (a degraded allow
//!    records the same entry, so it is consistent whether Redis ran the call or not);
//! 2. once **settled**, its entry is looked for in its shard's stream (around when it was
//!    made) and in SQL; not found, the call never ran: nothing to do;
//! 3. found, it is **voided** in one script (`giveback.lua`, `v` or `w`): its charge is
//!    given back whole (a hold is marked `voided`), its kept answer is deleted (a retry
//!    is decided afresh), and a ledger entry of kind `void` naming it is appended. A charge
//!    is voided once (a marker); a hold only while open.
//!
//! The exception is a keyed attempt whose retry was answered with its outcome first: the
//! replay marks the record (`keys::outcome_given`), and the void is refused. The outcome
//! is then the client's.
//!
//! What remains uncertain: the doubts live in the instance that met them. An instance that
//! dies (or is killed) before it voided leaves the charge in place, recorded like any other.
//! A graceful stop voids what is due first (within the settle time).
//!
//! A consume across Redis Cluster slots (budgets shared by subjects, `engine::crossslot`)
//! commits at its finalize, which carries no call deadline: it is settled once its intent
//! is (`committed`, or `abandoned` by the caller or the sweeper within seconds), and its
//! void gives its share in the other slots back too, once each, like a refund across slots.

use crate::domain::{EntryId, EntryKind, LedgerEntry, TotalLine};
use crate::engine::codec::HoldRecord;
use crate::engine::decision::giveback::Settle;
use crate::engine::recovery::Recovery;
use crate::engine::store::{GiveBack, GiveBackKind, GivenBack, IdempotencyRecord, StoreError};
use crate::engine::EngineError;
use crate::keys::{self, SubjectKeys};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far apart the clocks of instances and Redis may be, ms (`consume.lua`'s CLOCK_SKEW).
pub(crate) const CLOCK_SKEW_MS: i64 = 1_000;

/// How often settled doubts are voided.
pub(crate) const VOID_EVERY: Duration = Duration::from_secs(1);

/// How long a doubt is retried while Redis or the ledger cannot answer; past it, it is
/// logged and dropped (the charge stays, recorded).
const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

/// How long a failed void waits before it is tried again, ms.
const RETRY_MS: i64 = 2_000;

/// How long a call that voids every doubt (`all`) tries again one that failed, before it
/// leaves it to the background voids (a graceful stop waits this long at most).
const ALL_RETRY_FOR: Duration = Duration::from_secs(5);

/// One attempt answered 503 that Redis may have decided.
#[derive(Debug, Clone)]
struct Doubt {
    /// When it is settled (or tried again), wall-clock ms.
    due_ms: i64,
    /// Where its entry would be appended, and from and to when (wall-clock ms).
    stream: String,
    window: (i64, i64),
    /// The entry it would have appended (a charge or a hold).
    entry: LedgerEntry,
    /// Its idempotency record's key, if keyed.
    idempotency: Option<String>,
    /// Across Redis Cluster slots: its intent's key (the intent says whether it committed).
    intent: Option<String>,
    /// When it was registered.
    since: Instant,
}

/// The attempts in doubt, waiting to be settled.
#[derive(Debug, Default)]
pub(crate) struct Doubts(Mutex<Vec<Doubt>>);

impl Doubts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Doubt>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `entry`'s attempt, whose call was sent at most `timeout` before the
    /// store's `now` (ms): see [`Followup::doubt`](crate::engine::followup::Followup::doubt).
    pub(super) fn push(
        &self,
        entry: &LedgerEntry,
        stream: &str,
        (now, timeout): (i64, std::time::Duration),
        idempotency: Option<String>,
        intent: Option<String>,
    ) {
        let timeout = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        // The call was sent at most `timeout` ago, and carried now + timeout at most.
        let deadline = now.saturating_add(timeout);
        self.lock().push(Doubt {
            due_ms: deadline.saturating_add(2 * CLOCK_SKEW_MS),
            stream: stream.to_owned(),
            window: (
                now - timeout - 2 * CLOCK_SKEW_MS,
                deadline.saturating_add(2 * CLOCK_SKEW_MS),
            ),
            entry: entry.clone(),
            idempotency,
            intent,
            since: Instant::now(),
        });
    }
}

/// What settling one doubt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Voided {
    /// Redis never ran the call.
    NeverRan,
    /// It ran; its charge was given back and a `void` entry appended.
    Voided,
    /// It ran and stays: a retry was answered with its outcome, or (a hold) it was
    /// settled or expired meanwhile. The text says which.
    Kept(String),
}

impl Recovery {
    /// Voids every doubt settled by now (`all`: every one, waiting until it settles, and
    /// trying a failed void again for [`ALL_RETRY_FOR`]); returns what each found. A void
    /// that failed is left to the background voids, never given up before
    /// [`GIVE_UP_AFTER`].
    pub async fn void_settled(&self, all: bool) -> Vec<Voided> {
        let mut due: std::collections::VecDeque<Doubt> = {
            let mut doubts = self.followups.doubts.lock();
            let now = self.counters.store_now_ms();
            let (due, later): (Vec<Doubt>, _) =
                doubts.drain(..).partition(|d| all || d.due_ms <= now);
            *doubts = later;
            due.into()
        };
        let started = Instant::now();
        let mut found = Vec::with_capacity(due.len());
        while let Some(mut doubt) = due.pop_front() {
            let wait = doubt.due_ms - self.counters.store_now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
            }
            match self.settle_doubt(&doubt).await {
                // Its intent is still open: the caller's abandon or the sweeper settles it.
                Ok(None) if doubt.since.elapsed() < GIVE_UP_AFTER => {
                    doubt.due_ms = self.counters.store_now_ms() + RETRY_MS;
                    self.followups.doubts.lock().push(doubt);
                }
                Ok(None) => tracing::error!(
                    entry = %doubt.entry.id,
                    "gave up voiding an attempt answered 503: its intent never settled"
                ),
                Ok(Some(settled)) => {
                    match &settled {
                        Voided::Voided => tracing::info!(
                            entry = %doubt.entry.id,
                            kind = doubt.entry.kind.as_str(),
                            "voided an attempt answered 503 that Redis decided all the same"
                        ),
                        Voided::Kept(why) => tracing::info!(
                            entry = %doubt.entry.id,
                            why,
                            "an attempt answered 503 that Redis decided stays charged"
                        ),
                        Voided::NeverRan => {}
                    }
                    found.push(settled);
                }
                // Tried again, never given up at once: here while `all` waits for every
                // doubt (not past ALL_RETRY_FOR), else by the background voids.
                Err(error) if doubt.since.elapsed() < GIVE_UP_AFTER => {
                    static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::warn!(error = %error, count, "voiding an attempt answered 503 failed; will retry");
                    }
                    doubt.due_ms = self.counters.store_now_ms() + RETRY_MS;
                    match all && started.elapsed() < ALL_RETRY_FOR {
                        true => due.push_back(doubt),
                        false => self.followups.doubts.lock().push(doubt),
                    }
                }
                Err(error) => tracing::error!(
                    error = %error,
                    entry = %doubt.entry.id,
                    "gave up voiding an attempt answered 503: if Redis decided it, it stays charged (and recorded)"
                ),
            }
        }
        found
    }

    /// Voids settled doubts every `every`, until the task is aborted.
    pub(crate) async fn void_every(&self, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            self.void_settled(false).await;
        }
    }

    /// Settles one doubt (see the module doc); `None` while it cannot be settled yet.
    async fn settle_doubt(&self, doubt: &Doubt) -> Result<Option<Voided>, EngineError> {
        if let Some(intent) = &doubt.intent {
            let now_ms = self.now().timestamp_millis();
            if let Some(text) = self.counters.record(intent, now_ms).await? {
                let (state, _) =
                    crate::engine::codec::decode_intent(&text).map_err(StoreError::from)?;
                match state.as_str() {
                    "open" => return Ok(None),
                    "committed" => return self.void(doubt).await.map(Some),
                    _ => return Ok(Some(Voided::NeverRan)),
                }
            }
            // Gone (its record outlived the settle time): the ledger tells.
        }
        let id = doubt.entry.id.to_string();
        let in_stream = self
            .pipeline
            .durability()
            .in_stream(&doubt.stream, doubt.window, &id)
            .await?;
        let applied = in_stream || !self.ledger.seqs_of(&[id]).await?.is_empty();
        // A consume recorded in the totals is folded into a row of its minute once moved.
        let applied = applied
            || (!doubt.entry.totals.is_empty()
                && self
                    .ledger
                    .folded_in(doubt.entry.id, doubt.entry.at)
                    .await?);
        if !applied {
            return Ok(Some(Voided::NeverRan));
        }
        self.void(doubt).await.map(Some)
    }

    /// Voids `doubt`'s charge or hold, which Redis applied: at home in one script, then
    /// its share in other Redis Cluster slots (kept pending at home until given).
    async fn void(&self, doubt: &Doubt) -> Result<Voided, EngineError> {
        let (void, request) = self.void_request(doubt)?;
        let home = keys::shard(void.action.as_str(), void.subject.as_str());
        // A void tells no alert (its charge was answered 503).
        let giving = self.decider.giving_back(home, void, None, |_| request);
        let (_, given) = self.decider.apply(giving).await?;
        Ok(match given {
            GivenBack::Done { .. } => Voided::Voided,
            GivenBack::Conflict(why) => Voided::Kept(why),
            GivenBack::Unknown => Voided::Kept("the hold is gone".to_owned()),
            GivenBack::Replayed(_) => Voided::Kept("replayed".to_owned()),
        })
    }

    /// The `void` entry of `doubt`'s charge or hold, and the give-back that applies it.
    fn void_request(&self, doubt: &Doubt) -> Result<(LedgerEntry, GiveBack), EngineError> {
        let entry = &doubt.entry;
        let now = self.now();
        let keys = SubjectKeys::new(&self.prefix, &entry.action, &entry.subject);
        let idempotency = doubt.idempotency.as_ref().map(|key| IdempotencyRecord {
            key: key.clone(),
            ttl_ms: 0,
            record: keys::outcome_given(key),
            pending: false,
        });
        let void = LedgerEntry {
            folded: Vec::new(),
            id: EntryId::new(),
            at: now,
            kind: EntryKind::Void,
            action: entry.action.clone(),
            subject: entry.subject.clone(),
            amount: entry.amount,
            consumption_id: entry.consumption_id,
            hold_id: entry.hold_id,
            idempotency_key: entry.idempotency_key.clone(),
            policies: crate::engine::decision::giveback::given(&entry.counters, entry.amount, true),
            attributes: entry.attributes.clone(),
            // A charge recorded in the totals has no entry of its own for a replay to find
            // (it is folded): its void names the counters it gives back.
            counters: match entry.totals.is_empty() {
                true => Vec::new(),
                false => entry.counters.clone(),
            },
            hold_expires_at: None,
            kept_answer: None,
            // A voided charge recorded in the totals is taken out of them.
            totals: entry.totals.iter().map(TotalLine::voided).collect(),
        };
        if let Some((hold_id, record)) = HoldRecord::opened_by(entry) {
            let (_, mut request) =
                self.decider
                    .hold_give_back(hold_id, &record, Some(Settle::Release), now)?;
            request.kind = GiveBackKind::VoidHold {
                total: entry.amount,
                expires_at_ms: record.expires_at_ms,
            };
            request.ledger = self.pipeline.stream_entry(hold_id.shard(), &void);
            request.idempotency = idempotency;
            return Ok((void, request));
        }
        let consumption = entry
            .consumption_id
            .map(|id| id.to_string())
            .unwrap_or_default();
        let request = GiveBack {
            kind: GiveBackKind::Void {
                total: entry.amount,
            },
            pending: None,
            reports_usage: false,
            control_key: keys::void_marker(&self.prefix, keys.shard, &consumption),
            hold_index: None,
            counters: entry.counters.clone(),
            ledger: self.pipeline.stream_entry(keys.shard, &void),
            idempotency,
        };
        Ok((void, request))
    }
}
