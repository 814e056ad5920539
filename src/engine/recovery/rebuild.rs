//! Rebuilding what the counter store keeps from the ledger, the book of record: usage,
//! open holds and the answers kept for idempotent retries.
//!
//! The embedded default keeps its counters in the process, so every start replays the
//! ledger into a fresh store before the first request is answered. The replay applies each
//! entry of the recent past as it happened, at its own time and in the order entries were
//! made (within [`REORDER`] entries of their insertion), through the same arithmetic
//! as the live path: a charge or hold puts its units back on the counters it charged
//! (whatever the limits are now: it was allowed), a refund or a hold's settlement or expiry
//! gives back as it did, a hold is opened again with its record and its expiry, and an
//! answer kept for retries is kept again until it would have expired. Entries older than
//! the [horizon](horizon) no longer count anywhere and are not read.
//!
//! After a snapshot (`engine::snapshot`) was loaded into the store, only the entries after
//! the `seq` it covers are replayed: a settlement of a hold opened before it then finds
//! the hold's record in the store, and a refund counts every refund before the replay.

use crate::domain::{
    CalendarPeriod, CounterCharge, EntryKind, HoldId, LedgerEntry, Quantity, Restore, Window,
};
use crate::engine::codec::{self, HoldRecord};
use crate::engine::decision::giveback::Settle;
use crate::engine::recovery::pages::Pages;
use crate::engine::recovery::Recovery;
use crate::engine::state::{Rebuilt, Replay, ReplayOp};
use crate::engine::store::{Algorithm, Charge, StoreError, MAX_UNITS};
use crate::engine::EngineError;
use crate::keys::{self, SubjectKeys};
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;

/// Entries read (and replayed) per page.
pub(in crate::engine) const PAGE: u32 = 5_000;

/// How many entries a replay keeps back to replay in the order they were made rather than
/// inserted. With Redis the two differ: an entry that waited in a stream (its drain failed,
/// or its instance died and another claimed it) is inserted after later ones, and a token
/// bucket, or a refund replayed before its charge, would come out otherwise than it was.
/// Entries inserted further apart than this are replayed as inserted.
pub(in crate::engine) const REORDER: usize = 20_000;

/// How far back the replay reads at least: a hold lives up to 30 days and its record a
/// week more (so a late commit gets its 409), and a calendar month is 31 days.
const MIN_HORIZON: Duration = Duration::days(38);

/// The longest calendar year, with a day to spare for a cut-off (`day_start`) and the
/// largest UTC offsets.
const YEAR_SECONDS: u64 = 367 * 86_400;

/// Further back than any ledger entry: a lifetime window's counters are rebuilt from all of
/// it (such a ledger is kept forever; see `api::admin`).
const WHOLE_LEDGER_SECONDS: u64 = 1_000 * 366 * 86_400;

/// A calendar counter's lifetime when its entry predates the recorded period end: the
/// longest period (a month), so it is never dropped early.
const CALENDAR_FALLBACK_MS: i64 = 32 * 86_400_000;

/// How far back a replay must read: past the longest window of any policy, enabled or not
/// (a unit charged earlier counts nowhere now, even if a policy is enabled again; and an
/// answer kept for retries lives as long as its longest window, plus an hour), and past
/// [`MIN_HORIZON`].
pub(crate) fn horizon(windows: &[Window]) -> Duration {
    let longest = windows
        .iter()
        .map(|window| match *window {
            // The horizon covers a month already; a year needs its own length.
            Window::Calendar {
                period: CalendarPeriod::Year,
                ..
            } => YEAR_SECONDS,
            Window::Calendar { .. } => 0,
            Window::Rolling {
                seconds,
                bucket_seconds,
            } => seconds + bucket_seconds,
            Window::TokenBucket { seconds } => seconds,
            Window::Request => 0,
            Window::Lifetime => WHOLE_LEDGER_SECONDS,
        })
        .max()
        .unwrap_or(0);
    let longest = Duration::seconds(i64::try_from(longest).unwrap_or(i64::MAX / 1_000));
    MIN_HORIZON.max(longest + Duration::hours(1))
}

impl Recovery {
    /// Replays ledger entries into `target`: with `after` `None`, the recent entries into a
    /// fresh store; with `Some(seq)`, those inserted after `seq` into a store that a
    /// snapshot covering `seq` was loaded into. (The holds that expired meanwhile are then
    /// released by `expire_due_holds`, as `startup` does.)
    pub(crate) async fn rebuild(
        &self,
        target: &dyn Replay,
        after: Option<i64>,
    ) -> Result<Rebuilt, EngineError> {
        self.replay_ledger(target, after, None, &|_| true).await
    }

    /// Replays the entries after `after` (or of the horizon), up to the one numbered
    /// `until` when given, that `wanted` keeps, into `target`.
    pub(in crate::engine) async fn replay_ledger(
        &self,
        target: &dyn Replay,
        after: Option<i64>,
        until: Option<i64>,
        wanted: &(dyn Fn(&LedgerEntry) -> bool + Sync),
    ) -> Result<Rebuilt, EngineError> {
        let mut replayer = Replayer::after(after);
        let mut rebuilt = self
            .replay_pages(&mut replayer, target, until, wanted)
            .await?;
        rebuilt.steps += self.replay_waiting(&mut replayer, target, 0).await?;
        Ok(rebuilt)
    }

    /// Replays the entries inserted after those `replayer` replayed (the first time, of the
    /// horizon), up to the one numbered `until` when given, that `wanted` keeps, but for
    /// the last [`REORDER`] of them, which wait in `replayer` ([`Recovery::replay_waiting`]).
    pub(in crate::engine) async fn replay_pages(
        &self,
        replayer: &mut Replayer,
        target: &dyn Replay,
        until: Option<i64>,
        wanted: &(dyn Fn(&LedgerEntry) -> bool + Sync),
    ) -> Result<Rebuilt, EngineError> {
        let now = self.now();
        let mut rebuilt = Rebuilt::default();
        let after = match replayer.next_after {
            Some(after) => after,
            None => {
                let from = now - horizon(&self.cache.windows());
                match self.ledger.first_seq_since(from).await? {
                    Some(first) => {
                        replayer.first_seq = first;
                        first - 1
                    }
                    None => return Ok(rebuilt),
                }
            }
        };
        let mut pages = Pages::after(self.ledger.clone(), after, PAGE, None);
        loop {
            let mut page = pages.next().await?;
            if let Some(until) = until {
                page.retain(|(seq, _)| *seq <= until);
            }
            let Some((last, _)) = page.last() else {
                break;
            };
            replayer.next_after = Some(*last);
            rebuilt.entries += page.len();
            for (_, entry) in page.into_iter().filter(|(_, entry)| wanted(entry)) {
                replayer.wait(entry);
            }
            rebuilt.steps += self.replay_waiting(replayer, target, REORDER).await?;
        }
        Ok(rebuilt)
    }

    /// Replays the entries waiting in `replayer`, in the order they were made (by `at`, then
    /// by id), until `keep` wait.
    pub(in crate::engine) async fn replay_waiting(
        &self,
        replayer: &mut Replayer,
        target: &dyn Replay,
        keep: usize,
    ) -> Result<usize, EngineError> {
        let now = self.now();
        let mut ops = Vec::new();
        while replayer.waiting.len() > keep {
            let Some(entry) = replayer.next() else {
                break;
            };
            ops.extend(self.replay_of(replayer, target, &entry, now).await?);
        }
        let steps = ops.len();
        target.replay(ops).await?;
        Ok(steps)
    }

    /// Replays `entries`, which are not in SQL (yet): they wait in the ledger streams. They
    /// are replayed in order with those still waiting in `replayer`, then every entry is.
    /// A refund among them finds its charge among them too.
    pub(in crate::engine) async fn replay_streamed(
        &self,
        replayer: &mut Replayer,
        target: &dyn Replay,
        entries: Vec<LedgerEntry>,
    ) -> Result<(), EngineError> {
        for entry in entries {
            if let (EntryKind::Charge, Some(consumption)) = (entry.kind, entry.consumption_id) {
                replayer.streamed.insert(consumption, entry.clone());
            }
            replayer.wait(entry);
        }
        self.replay_waiting(replayer, target, 0).await?;
        Ok(())
    }

    /// The steps that apply `entry` again.
    async fn replay_of(
        &self,
        replayer: &mut Replayer,
        target: &dyn Replay,
        entry: &LedgerEntry,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReplayOp>, EngineError> {
        let at_ms = entry.at.timestamp_millis();
        let mut ops = Vec::new();
        match entry.kind {
            EntryKind::Charge | EntryKind::Hold => {
                let charges: Vec<Charge> = entry
                    .counters
                    .iter()
                    .map(|c| replayed_charge(c, at_ms))
                    .collect();
                if !charges.is_empty() {
                    ops.push(ReplayOp::Charge { at_ms, charges });
                }
                ops.extend(self.kept_answer_of(entry, now));
                if entry.kind == EntryKind::Hold {
                    ops.extend(self.open_hold(replayer, entry));
                }
            }
            // A voided charge is given back whole, like a refund of all of it; a voided
            // hold like a release.
            EntryKind::Refund => ops.extend(self.refund_of(replayer, entry).await?),
            EntryKind::Void if entry.consumption_id.is_some() => {
                ops.extend(self.refund_of(replayer, entry).await?);
            }
            EntryKind::Commit | EntryKind::Release | EntryKind::Expire | EntryKind::Void => {
                ops.extend(self.settlement_of(replayer, target, entry).await?);
            }
            EntryKind::Deny => {}
        }
        ops.extend(self.decider.share_markers(entry, &ops));
        Ok(ops)
    }

    /// The answer kept for retries of a charge or hold, while it is still kept.
    fn kept_answer_of(&self, entry: &LedgerEntry, now: DateTime<Utc>) -> Option<ReplayOp> {
        let kept = entry.kept_answer.as_ref()?;
        let key = entry.idempotency_key.as_ref()?;
        if kept.expires_at_ms <= now.timestamp_millis() {
            return None;
        }
        let scope = if entry.kind == EntryKind::Hold {
            'h'
        } else {
            'c'
        };
        let keys = SubjectKeys::new(&self.prefix, &entry.action, &entry.subject);
        Some(ReplayOp::Record {
            key: keys.idempotency(scope, key.as_str()),
            text: kept.text.clone(),
            expires_at_ms: kept.expires_at_ms,
        })
    }

    /// A hold's record and index entry, as its consume opened them.
    fn open_hold(&self, replayer: &mut Replayer, entry: &LedgerEntry) -> Vec<ReplayOp> {
        let Some((hold_id, record)) = HoldRecord::opened_by(entry) else {
            // Written before holds recorded their expiry: it cannot be opened again.
            return Vec::new();
        };
        let (shard, member) = (hold_id.shard(), hold_id.to_string());
        let ops = vec![
            ReplayOp::Record {
                key: keys::hold_record(&self.prefix, shard, &member),
                text: format!("open\n{}", codec::encode_hold_record(&record)),
                expires_at_ms: record.expires_at_ms
                    + crate::engine::decision::consume::HOLD_RECORD_EXTRA_MS,
            },
            ReplayOp::IndexHold {
                index_key: keys::holds_index(&self.prefix, shard),
                hold_id: member,
                expires_at_ms: record.expires_at_ms,
            },
        ];
        replayer.holds.insert(hold_id, record);
        ops
    }

    /// A refund's give-back. Its charge is read from the ledger; one older than the
    /// horizon gives back to nothing that still counts, and is passed over.
    async fn refund_of(
        &self,
        replayer: &mut Replayer,
        entry: &LedgerEntry,
    ) -> Result<Option<ReplayOp>, EngineError> {
        let Some(consumption_id) = entry.consumption_id else {
            return Ok(None);
        };
        let charge = match replayer.streamed.get(&consumption_id) {
            Some(charge) => Some(charge.clone()),
            None => self.ledger.charge_of(consumption_id).await?,
        };
        let charge = match charge {
            Some(charge) => charge,
            // The void of a consume recorded in the totals (folded into a row of its
            // minute, no entry of its own) names the counters it gives back itself.
            None if entry.kind == EntryKind::Void && !entry.counters.is_empty() => LedgerEntry {
                kind: EntryKind::Charge,
                ..entry.clone()
            },
            None => return Ok(None),
        };
        // The store's running total must count the refunds written before the horizon too,
        // or a later refund could pass the charge.
        let refunded = match replayer.refunded.get(&consumption_id) {
            Some(refunded) => *refunded,
            None => {
                self.ledger
                    .refunded_before(consumption_id, replayer.first_seq)
                    .await?
            }
        };
        let mut request = self.decider.refund_give_back(&charge, entry, refunded);
        replayer
            .refunded
            .insert(consumption_id, refunded + entry.amount);
        request.ledger = None;
        let at_ms = entry.at.timestamp_millis();
        Ok(Some(ReplayOp::GiveBack {
            at_ms,
            request: Box::new(request),
        }))
    }

    /// A hold's settlement or expiry, if the hold was opened within the horizon, or
    /// (after a snapshot) before the snapshot: its record is then the one the snapshot
    /// restored into `target`. (Settling a hold that is no longer open is refused by the
    /// store, as it was when it happened.)
    async fn settlement_of(
        &self,
        replayer: &mut Replayer,
        target: &dyn Replay,
        entry: &LedgerEntry,
    ) -> Result<Option<ReplayOp>, EngineError> {
        let Some(hold_id) = entry.hold_id else {
            return Ok(None);
        };
        let record = match replayer.holds.remove(&hold_id) {
            Some(record) => record,
            None if replayer.after_snapshot => {
                let key = keys::hold_record(&self.prefix, hold_id.shard(), &hold_id.to_string());
                match target.record(&key, entry.at.timestamp_millis()).await? {
                    Some(text) => codec::decode_hold_record(&text).map_err(StoreError::from)?,
                    None => return Ok(None),
                }
            }
            None => return Ok(None),
        };
        let how = settlement(entry)?;
        let (_, mut request) = self
            .decider
            .hold_give_back(hold_id, &record, how, entry.at)?;
        request.ledger = None;
        let at_ms = entry.at.timestamp_millis();
        Ok(Some(ReplayOp::GiveBack {
            at_ms,
            request: Box::new(request),
        }))
    }
}

/// How the settlement `entry` (a commit, release, void or expiry) settled its hold: as
/// the ledger says, the book of record (a commit above the hold was over-captured).
pub(in crate::engine) fn settlement(entry: &LedgerEntry) -> Result<Option<Settle>, StoreError> {
    Ok(match entry.kind {
        EntryKind::Commit => Some(Settle::Commit {
            amount: Some(
                Quantity::parse("amount", i128::from(entry.amount))
                    .map_err(|e| StoreError::Protocol(e.to_string()))?,
            ),
            over_capture: true,
        }),
        EntryKind::Release | EntryKind::Void => Some(Settle::Release),
        _ => None,
    })
}

/// What a replay remembers between entries.
#[derive(Default)]
pub(in crate::engine) struct Replayer {
    /// The holds opened by the entries replayed so far and not yet settled.
    holds: HashMap<HoldId, HoldRecord>,
    /// What was refunded so far, per consumption with a replayed refund (those before the
    /// horizon included).
    refunded: HashMap<crate::domain::ConsumptionId, u64>,
    /// The first entry replayed.
    first_seq: i64,
    /// Whether a snapshot was loaded before: holds opened before it are in the store.
    after_snapshot: bool,
    /// The last entry replayed (`None` before the first page: then the horizon's first).
    next_after: Option<i64>,
    /// The charges replayed from the streams, for their refunds.
    streamed: HashMap<crate::domain::ConsumptionId, LedgerEntry>,
    /// Entries read and not yet replayed, by when they were made: the instant, then the id
    /// (time-ordered: within one process, in the order they were made; an entry that
    /// waited in a stream is inserted after later ones). The third part places a give-back
    /// right after its charge or hold: see [`Self::next`].
    waiting: std::collections::BTreeMap<(i64, u128, u64), LedgerEntry>,
    /// Entries read so far.
    read: u64,
}

impl Replayer {
    /// Puts `entry` among those waiting to be replayed.
    pub(in crate::engine) fn wait(&mut self, entry: LedgerEntry) {
        self.read += 1;
        self.waiting
            .insert((entry.at.timestamp_millis(), entry.id.to_bits(), 0), entry);
    }

    /// The next entry to replay: the first by when it was made (its instant, then its
    /// id); but a refund or settlement whose charge or hold was made in the same
    /// millisecond and waits still is put right after it (made by another instance, its id
    /// may sort first).
    pub(in crate::engine) fn next(&mut self) -> Option<LedgerEntry> {
        loop {
            let ((at_ms, _, _), entry) = self.waiting.pop_first()?;
            let needs = |other: &LedgerEntry| match entry.kind {
                EntryKind::Refund | EntryKind::Void if entry.consumption_id.is_some() => {
                    other.kind == EntryKind::Charge && other.consumption_id == entry.consumption_id
                }
                EntryKind::Commit | EntryKind::Release | EntryKind::Expire | EntryKind::Void => {
                    other.kind == EntryKind::Hold && other.hold_id == entry.hold_id
                }
                _ => false,
            };
            let after = self
                .waiting
                .range((at_ms, 0, 0)..(at_ms + 1, 0, 0))
                .find(|(_, other)| needs(other))
                .map(|((_, other_id, _), _)| *other_id);
            match after {
                Some(other_id) => {
                    self.read += 1;
                    self.waiting.insert((at_ms, other_id, self.read), entry);
                }
                None => return Some(entry),
            }
        }
    }

    /// How many entries wait to be replayed.
    pub(in crate::engine) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The last entry of SQL read, if any.
    pub(in crate::engine) fn last_seq(&self) -> Option<i64> {
        self.next_after
    }

    /// A replay of the entries after the one numbered `after` (a snapshot's), or of the
    /// horizon.
    pub(in crate::engine) fn after(after: Option<i64>) -> Self {
        Self {
            first_seq: after.map_or(0, |after| after + 1),
            after_snapshot: after.is_some(),
            next_after: after,
            ..Self::default()
        }
    }
}

/// The charge that puts `counter`'s units back on it at `at_ms`.
fn replayed_charge(counter: &CounterCharge, at_ms: i64) -> Charge {
    let (algorithm, limit) = match counter.restore {
        Restore::Calendar { period_end_ms } => {
            let period_end_ms = match period_end_ms {
                0 => at_ms + CALENDAR_FALLBACK_MS,
                end => end,
            };
            (Algorithm::Calendar { period_end_ms }, MAX_UNITS)
        }
        Restore::Rolling {
            bucket_ms, buckets, ..
        } => (Algorithm::Rolling { bucket_ms, buckets }, MAX_UNITS),
        Restore::TokenBucket { period_ms, limit } => (Algorithm::TokenBucket { period_ms }, limit),
        Restore::Lifetime => (Algorithm::Lifetime, MAX_UNITS),
        // Replayed at its own instant, in ledger order: the same periods start again.
        Restore::ZonedCalendar { period_end_ms, .. } => {
            (Algorithm::ZonedCalendar { period_end_ms }, MAX_UNITS)
        }
    };
    Charge {
        key: keys::CounterKey::read(counter.key.as_str()),
        algorithm,
        limit,
        cost: counter.charged,
        enforce: true,
    }
}
