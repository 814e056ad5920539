//! The in-process counter store: the same counting as `redis/script/consume.lua`, in Rust.
//!
//! It is a production backend (the default when no Redis is configured), not a test double:
//! state is sharded so that unrelated subjects do not contend, entries expire exactly like the
//! Redis keys (by the `now_ms` of the calls, never the wall clock, so tests with a fake clock
//! see expiry too), and expired entries are purged as the store is used, keeping memory bounded
//! by the recently active counters.
//!
//! The per-algorithm arithmetic lives in [`counting`]; this file owns the shards, the locking
//! and the two passes of a decision (read and decide, then apply), plus the argument checks
//! that both backends run before touching any state.

mod counting;
mod giveback;
mod replay;
mod undo;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use crate::engine::codec;
use crate::engine::store::{
    check_charges, Charge, Consume, CounterStore, Decided, Effects, Evaluation, GiveBack,
    GivenBack, StoreError, Undo, Undoable,
};
use crate::keys::hash_tag;
use counting::Entry;
use giveback::{give_back_in, give_back_keys};
use undo::{confirm_in, undo_in, undo_keys, PENDING};

/// Number of independently locked shards; a power of two well above the core count.
const SHARDS: usize = 64;

/// A shard is swept of expired entries once it has served this many decisions, or as many
/// decisions as it holds entries if that is more: sweeping then costs O(1) amortised per call,
/// and a shard holds at most its live entries plus those written since its last sweep.
const SWEEP_MIN_CALLS: usize = 64;

/// Counters held in this process.
///
/// Each shard is a `std::sync::Mutex`, not a Tokio one: the critical section is a few hash-map
/// operations with no `.await` inside, so a blocking lock is both correct and cheaper, and an
/// async mutex would only add a queue. The keys of one subject share a hash tag and therefore
/// a shard, so most decisions take one lock, once, which makes them atomic; one that also
/// charges budgets shared by subjects (other hash tags) takes every shard it touches
/// ([`MemoryCounterStore::with_keys`]).
pub struct MemoryCounterStore {
    /// The shards, chosen by hashing a key's hash tag.
    shards: Box<[Mutex<Shard>]>,
    /// Randomly seeded so that subjects cannot be crafted to pile onto one shard.
    hasher: RandomState,
}

/// One lock's worth of counters.
#[derive(Default)]
struct Shard {
    /// Counter key -> state and expiry.
    entries: HashMap<String, Entry>,
    /// Decisions served since the last sweep.
    calls_since_sweep: usize,
}

impl MemoryCounterStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Number of entries held, including expired ones not yet purged.
    #[cfg(test)]
    fn key_count(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).entries.len())
            .sum()
    }

    /// The shard that holds every key carrying the same hash tag as `key`.
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.shard_index(key)]
    }

    fn shard_index(&self, key: &str) -> usize {
        let hash = self.hasher.hash_one(hash_tag(key));
        // The modulo keeps the value below SHARDS, so the cast cannot truncate.
        (hash % SHARDS as u64) as usize
    }

    /// Runs `f` atomically over `keys` (at least one): on the shard of the first key, with
    /// the entries of the other keys moved into it for the call and back after it. Every
    /// shard involved is locked for the whole call, in ascending order (never a deadlock).
    fn with_keys<R>(&self, keys: &[&str], f: impl FnOnce(&mut Shard) -> R) -> R {
        let anchor = keys.first().map_or(0, |key| self.shard_index(key));
        let foreign: Vec<(&str, usize)> = keys
            .iter()
            .map(|key| (*key, self.shard_index(key)))
            .filter(|(_, index)| *index != anchor)
            .collect();
        if foreign.is_empty() {
            return f(&mut lock(&self.shards[anchor]));
        }
        let mut order: Vec<usize> = foreign.iter().map(|(_, index)| *index).collect();
        order.push(anchor);
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<_> = order.iter().map(|&i| lock(&self.shards[i])).collect();
        let at = |index: usize| order.iter().position(|&i| i == index).unwrap_or(0);
        let home = at(anchor);
        for (key, index) in &foreign {
            if let Some(entry) = guards[at(*index)].entries.remove(*key) {
                guards[home].entries.insert((*key).to_owned(), entry);
            }
        }
        let result = f(&mut guards[home]);
        for (key, index) in &foreign {
            if let Some(entry) = guards[home].entries.remove(*key) {
                guards[at(*index)].entries.insert((*key).to_owned(), entry);
            }
        }
        result
    }

    /// Milliseconds until `key` expires as seen at `now_ms` (-1 for never, as Redis's PTTL
    /// says), `None` if it is absent.
    #[cfg(test)]
    pub(super) fn ttl_ms(&self, key: &str, now_ms: i64) -> Option<i64> {
        let shard = lock(self.shard(key));
        shard
            .entries
            .get(key)
            .filter(|e| e.is_live(now_ms))
            .map(|e| match e.expires_at_ms {
                i64::MAX => -1,
                at => at - now_ms,
            })
    }

    /// Number of buckets stored for the rolling counter `key` (0 if absent or another kind).
    #[cfg(test)]
    pub(super) fn bucket_count(&self, key: &str) -> usize {
        lock(self.shard(key))
            .entries
            .get(key)
            .map_or(0, Entry::bucket_count)
    }
}

impl Default for MemoryCounterStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryCounterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCounterStore")
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// Locks a shard. A poisoned lock (a panic while held) is taken over rather than propagated:
/// nothing in pass 2 can panic, so a decision is never left half-applied, and every entry is
/// always a complete value.
fn lock(shard: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pass 1 and pass 2 of a decision on a locked shard (see `counting`).
fn evaluate_in(
    shard: &mut Shard,
    now_ms: i64,
    charges: &[Charge],
    commit: bool,
) -> Result<Evaluation, StoreError> {
    shard.calls_since_sweep += 1;
    if shard.calls_since_sweep >= shard.entries.len().max(SWEEP_MIN_CALLS) {
        shard.entries.retain(|_, entry| entry.is_live(now_ms));
        shard.calls_since_sweep = 0;
    }

    // Pass 1: read and decide every charge; nothing is written yet.
    let mut readings = Vec::with_capacity(charges.len());
    let mut allowed = true;
    for charge in charges {
        let entry = shard
            .entries
            .get(charge.key.as_str())
            .filter(|e| e.is_live(now_ms));
        let reading = counting::read(entry, now_ms, charge)?;
        allowed &= reading.outcome.allowed || !charge.enforce;
        readings.push(reading);
    }

    // Pass 2: when committing an allowed decision, apply every charge that changes something.
    let apply = commit && allowed;
    let mut outcomes = Vec::with_capacity(charges.len());
    for (charge, reading) in charges.iter().zip(readings) {
        let mut outcome = reading.outcome;
        if let (true, Some(write)) = (apply, reading.write) {
            outcome.used = write.used;
            outcome.resets_at_ms = write.resets_at_ms;
            counting::apply(&mut shard.entries, charge, now_ms, write);
        }
        outcomes.push(outcome);
    }
    Ok(Evaluation { allowed, outcomes })
}

#[async_trait]
impl CounterStore for MemoryCounterStore {
    async fn evaluate(
        &self,
        now_ms: i64,
        charges: &[Charge],
        commit: bool,
    ) -> Result<Evaluation, StoreError> {
        check_charges(now_ms, charges, true)?;
        if charges.is_empty() {
            return Ok(Evaluation {
                allowed: true,
                outcomes: Vec::new(),
            });
        }
        let keys: Vec<&str> = charges.iter().map(|c| c.key.as_str()).collect();
        self.with_keys(&keys, |shard| evaluate_in(shard, now_ms, charges, commit))
    }

    async fn decide(&self, call: &Consume<'_>) -> Result<Decided, StoreError> {
        let (charges, effects) = (call.charges, call.effects);
        check_charges(call.now_ms, charges, true)?;
        let mut keys: Vec<&str> = charges.iter().map(|c| c.key.as_str()).collect();
        keys.extend(effects.idempotency.as_ref().map(|i| i.key.as_str()));
        if let Some(hold) = &effects.hold {
            keys.extend([hold.record_key.as_str(), hold.index_key.as_str()]);
        }
        if keys.is_empty() {
            return Ok(Decided::Fresh(Evaluation {
                allowed: true,
                outcomes: Vec::new(),
            }));
        }
        self.with_keys(&keys, |shard| {
            decide_in(shard, call.now_ms, charges, call.commit, effects)
        })
    }

    async fn give_back(&self, now_ms: i64, request: &GiveBack) -> Result<GivenBack, StoreError> {
        let keys = give_back_keys(request);
        self.with_keys(&keys, |shard| {
            give_back_in(&mut shard.entries, now_ms, request)
        })
    }

    async fn expired_holds(
        &self,
        index_key: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let guard = lock(self.shard(index_key));
        Ok(counting::index_due(
            guard.entries.get(index_key),
            now_ms,
            limit,
        ))
    }

    async fn next_due(&self, index_key: &str) -> Result<Option<i64>, StoreError> {
        let guard = lock(self.shard(index_key));
        Ok(counting::index_first(guard.entries.get(index_key)))
    }

    async fn record(&self, record_key: &str, now_ms: i64) -> Result<Option<String>, StoreError> {
        let guard = lock(self.shard(record_key));
        Ok(counting::text(guard.entries.get(record_key), now_ms).map(str::to_owned))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Undoable for MemoryCounterStore {
    fn confirm(&self, now_ms: i64, change: &Undo) {
        if let Undo::Charge {
            idempotency: Some(key),
            ..
        } = change
        {
            let mut shard = lock(self.shard(key));
            confirm_in(&mut shard.entries, now_ms, change);
        }
    }

    fn undo(&self, now_ms: i64, undo: &Undo) -> Result<(), StoreError> {
        let keys = match undo {
            Undo::Charge { .. } => undo_keys(undo),
            Undo::GiveBack { request, .. } => give_back_keys(request),
        };
        if keys.is_empty() {
            return Ok(());
        }
        self.with_keys(&keys, |shard| undo_in(&mut shard.entries, now_ms, undo));
        Ok(())
    }
}

/// A decision with its effects, on the shard holding every key it touches.
fn decide_in(
    shard: &mut Shard,
    now_ms: i64,
    charges: &[Charge],
    commit: bool,
    effects: &Effects,
) -> Result<Decided, StoreError> {
    if let Some(idem) = &effects.idempotency {
        if let Some(kept) = counting::text(shard.entries.get(&idem.key), now_ms) {
            if kept.starts_with(PENDING) {
                return Ok(Decided::InFlight);
            }
            return codec::decode_replay(kept);
        }
    }
    let evaluation = evaluate_in(shard, now_ms, charges, commit)?;
    if commit && evaluation.allowed {
        if let Some(idem) = &effects.idempotency {
            let kept = codec::encode_replay(&idem.record, &evaluation);
            let kept = match idem.pending {
                true => format!("{PENDING}{kept}"),
                false => kept,
            };
            counting::set_text(&mut shard.entries, &idem.key, kept, now_ms + idem.ttl_ms);
        }
        if let Some(hold) = &effects.hold {
            let kept = format!("open\n{}", hold.record);
            counting::set_text(
                &mut shard.entries,
                &hold.record_key,
                kept,
                now_ms + hold.ttl_ms,
            );
            counting::index_add(
                &mut shard.entries,
                &hold.index_key,
                &hold.hold_id,
                hold.expires_at_ms,
            );
        }
    }
    Ok(Decided::Fresh(evaluation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::store::Algorithm;

    fn rolling_charge(key: String, cost: u64) -> Charge {
        Charge {
            key: crate::keys::CounterKey::read(key),
            algorithm: Algorithm::Rolling {
                bucket_ms: 1_000,
                buckets: 10,
            },
            limit: 100,
            cost,
            enforce: true,
        }
    }

    #[test]
    fn the_hash_tag_is_the_first_non_empty_braced_part_as_in_redis() {
        for (key, tag) in [
            ("ql:{sms|u1}:daily", "sms|u1"),
            ("a{b}c{d}", "b"),
            ("a}{b}", "b"),
            ("a{}b", "a{}b"),
            ("a{b", "a{b"),
            ("plain", "plain"),
        ] {
            assert_eq!(hash_tag(key), tag, "{key}");
        }
    }

    #[tokio::test]
    async fn expired_entries_are_purged_as_the_shard_is_used() {
        let store = MemoryCounterStore::new();
        let t0 = 1_000_000_000_000;
        for i in 0..100 {
            let charge = rolling_charge(format!("ql:{{tag}}:{i}"), 1);
            store
                .evaluate(t0, &[charge], true)
                .await
                .expect("evaluates");
        }
        assert_eq!(store.key_count(), 100);
        // Long after every TTL (W + B + grace), calls on the same shard sweep it.
        let later = t0 + 3_600_000;
        for _ in 0..100 {
            let look = rolling_charge("ql:{tag}:0".to_owned(), 0);
            let evaluation = store
                .evaluate(later, &[look], true)
                .await
                .expect("evaluates");
            assert_eq!(
                evaluation.outcomes[0].used, 0,
                "an expired entry counts as absent"
            );
        }
        assert_eq!(store.key_count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_decisions_on_one_subject_never_over_allow() {
        let store = std::sync::Arc::new(MemoryCounterStore::new());
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut allowed = 0;
                    for _ in 0..100 {
                        let charge = rolling_charge("ql:{hot}:calls".to_owned(), 1);
                        let evaluation = store.evaluate(0, &[charge], true).await;
                        allowed += u64::from(evaluation.expect("evaluates").allowed);
                    }
                    allowed
                })
            })
            .collect();
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("the task finishes");
        }
        assert_eq!(total, 100, "exactly the limit, out of 800 attempts");
    }
}
