//! Reconciliation: every live budget compared with the usage the ledger gives it.
//!
//! The counters are a cache of the ledger, so replaying the ledger into an empty store
//! must give back exactly the live counters. `Engine::verify` does that on the embedded
//! default: it takes the snapshot `cut` lock alone (every change holds it, shared, from
//! its store call until its entry is committed or undone), flushes the writer, notes the
//! ledger's last `seq` and dumps the live store, then lets changes resume; it replays the
//! ledger up to that `seq` into a scratch store and compares the two, counter by counter,
//! as usage at the same instant. A request in flight is therefore in both or in neither:
//! it never shows as drift.

use crate::domain::{Action, Budget, LedgerEntry, PolicyId, Restore};
use crate::engine::recovery::Recovery;
use crate::engine::state::Replay;
use crate::engine::state::{CounterState, StateItem};
use crate::engine::EngineError;
use crate::keys;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// One budget whose live usage differs from the ledger's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drift {
    /// The policy the counter belongs to (as the ledger names it, else the cache).
    pub(crate) policy_id: Option<PolicyId>,
    /// The budget, when the ledger names it (a counter the ledger knows nothing of has
    /// no entry to name it).
    pub(crate) budget: Option<Budget>,
    /// The counter's key in the counter store.
    pub(crate) key: String,
    /// Usage the live counter holds.
    pub(crate) live: u64,
    /// Usage the ledger gives it.
    pub(crate) ledger: u64,
}

/// What a verify found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Budgets compared (counters live or in the ledger).
    pub(crate) checked: usize,
    /// Those that differ, by key.
    pub(crate) drift: Vec<Drift>,
    /// Budgets that could not be compared: on a Redis Cluster, those shared by subjects
    /// while consumes across slots never paused (`engine::cut`).
    pub(crate) not_compared: usize,
}

/// Why a verify cannot tell.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    /// No consistent instant could be read (Redis): try again.
    #[error("the counters could not be read at one instant: {0}; try again")]
    Unsettled(&'static str),
    /// The ledger or the store failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The last verify's finding, for `/metrics` (`quota_counter_drift_budgets`), and the
/// drifting budgets already logged: each is logged once while it drifts.
#[derive(Debug, Default)]
pub(crate) struct DriftWatch {
    /// Budgets that drifted at the last verify; `None` before the first.
    budgets: Mutex<Option<u64>>,
    /// Keys of the drifting budgets logged already.
    logged: Mutex<std::collections::HashSet<String>>,
}

impl DriftWatch {
    /// Budgets that drifted at the last verify; `None` before the first.
    pub(crate) fn budgets(&self) -> Option<u64> {
        *self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a verify of every budget: sets the gauge, logs each newly drifting budget.
    fn saw(&self, verified: &Verified) {
        *self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(verified.drift.len() as u64);
        let mut logged = self
            .logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        logged.retain(|key| verified.drift.iter().any(|d| d.key == *key));
        for drift in &verified.drift {
            if logged.insert(drift.key.clone()) {
                tracing::error!(
                    policy_id = drift.policy_id.as_ref().map(PolicyId::as_str),
                    budget = drift.budget.as_ref().map(Budget::text),
                    key = drift.key,
                    live = drift.live,
                    ledger = drift.ledger,
                    "a budget's counter drifts from the ledger"
                );
            }
        }
    }
}

/// What the ledger says of each counter key a verify met, by key.
pub(crate) type KnownByKey = Mutex<HashMap<String, Known>>;

/// Learns what an entry says of the keys it charged; whether the replay takes it.
pub(crate) type Learn<'a> = dyn Fn(&LedgerEntry) -> bool + Sync + 'a;

/// What the ledger says of one counter key.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    policy_id: PolicyId,
    action: Action,
    /// `None` when only a folded row named it (it names no subject).
    budget: Option<Budget>,
    restore: Restore,
    /// A budget shared by subjects (its scope does not name the subject).
    pub(in crate::engine) shared: bool,
}

impl Known {
    /// Whether it is a budget of `action` (any, if `None`).
    pub(in crate::engine) fn of(&self, action: Option<&Action>) -> bool {
        action.is_none_or(|wanted| *wanted == self.action)
    }
}

/// Notes in `known` what `entry` says of the counters it names; keeps every entry.
fn learn(known: &KnownByKey, entry: &LedgerEntry) -> bool {
    let mut known = known
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for counter in &entry.counters {
        // A folded row names no subject: it names no budget, nor forgets one named.
        let budget = entry
            .folded
            .is_empty()
            .then(|| entry.budget(&counter.scope));
        if budget.is_none() && known.contains_key(&counter.key) {
            continue;
        }
        known.insert(
            counter.key.clone(),
            Known {
                policy_id: counter.policy_id.clone(),
                action: entry.action.clone(),
                budget,
                restore: counter.restore,
                shared: !counter.scope.has_subject(),
            },
        );
    }
    true
}

impl Recovery {
    /// Compares every live budget (of `action`, or all) with the ledger's usage.
    pub(crate) async fn verify(&self, action: Option<&Action>) -> Result<Verified, VerifyError> {
        let known = KnownByKey::default();
        let learn = |entry: &LedgerEntry| learn(&known, entry);
        let verified = self
            .pipeline
            .durability()
            .verify(self, action, &learn, &known)
            .await?;
        if action.is_none() {
            self.drift.saw(&verified);
        }
        Ok(verified)
    }

    /// `counters verify` of the embedded store: see the module doc.
    pub(crate) async fn verify_embedded(
        &self,
        snapshots: &crate::engine::recovery::snapshot::Snapshots,
        action: Option<&Action>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Verified, VerifyError> {
        let (live, covered, now_ms) = {
            let _paused = self.pipeline.pause().await?;
            let covered = snapshots
                .table
                .last_entry()
                .await
                .map_err(EngineError::from)?;
            let now_ms = self.now().timestamp_millis();
            (snapshots.store.dump(now_ms).await, covered, now_ms)
        };
        let replayed: std::sync::Arc<dyn Replay> = (self.scratch)();
        if let Some((until, _)) = covered {
            self.replay_ledger(replayed.as_ref(), None, Some(until), learn)
                .await?;
        }
        let ledger = replayed.dump(now_ms).await;
        let known = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(self.compare(&live, &ledger, &known, action, now_ms))
    }

    /// What the last verify of every budget found (for `/metrics`).
    pub(crate) fn drift_watch(&self) -> &DriftWatch {
        &self.drift
    }

    /// Verifies every budget every `every`, until the task is aborted; a verify that
    /// cannot tell is logged (at most once a second) and tried again next time.
    pub(crate) async fn verify_every(&self, every: std::time::Duration) {
        loop {
            tokio::time::sleep(every).await;
            match self.verify(None).await {
                Ok(verified) => tracing::info!(
                    checked = verified.checked,
                    drift = verified.drift.len(),
                    "verified the counters against the ledger"
                ),
                Err(error) => {
                    static SITE: crate::logs::Throttle = crate::logs::Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::warn!(error = %error, count, "verifying the counters failed; will try again");
                    }
                }
            }
        }
    }

    /// The drift between the `live` and `ledger` states' counters (of `action`, or all).
    pub(in crate::engine) fn compare(
        &self,
        live: &[StateItem],
        ledger: &[StateItem],
        known: &HashMap<String, Known>,
        action: Option<&Action>,
        now_ms: i64,
    ) -> Verified {
        let usage = |items: &[StateItem]| -> BTreeMap<String, u64> {
            items
                .iter()
                .filter_map(|item| {
                    let key = item_key(item)?;
                    let restore = known.get(key).map(|k| k.restore);
                    Some((key.to_owned(), usage_of(item, restore.as_ref(), now_ms)))
                })
                .collect()
        };
        let (live, ledger) = (usage(live), usage(ledger));
        let mut verified = Verified::default();
        let keys: std::collections::BTreeSet<&String> = live.keys().chain(ledger.keys()).collect();
        for key in keys {
            let owner = known
                .get(key)
                .map(|k| {
                    (
                        Some(k.policy_id.clone()),
                        Some(k.action.clone()),
                        k.budget.clone(),
                    )
                })
                .or_else(|| {
                    let (policy, action) = self.cache.owner_of(keys::counter_policy_key(key)?)?;
                    Some((Some(policy), Some(action), None))
                });
            let (policy_id, owner_action, budget) = owner.unwrap_or((None, None, None));
            if action.is_some_and(|wanted| owner_action.as_ref() != Some(wanted)) {
                continue;
            }
            verified.checked += 1;
            let (live, ledger) = (
                live.get(key).copied().unwrap_or(0),
                ledger.get(key).copied().unwrap_or(0),
            );
            if live != ledger {
                verified.drift.push(Drift {
                    policy_id,
                    budget,
                    key: key.clone(),
                    live,
                    ledger,
                });
            }
        }
        verified
    }
}

/// The key of a counter's state item (a zoned calendar period is kept as a record);
/// `None` for records and indexes that are no counters.
pub(in crate::engine) fn item_key(item: &StateItem) -> Option<&str> {
    match item {
        StateItem::Counter { key, .. } => Some(key),
        StateItem::Record { key, .. } => keys::counter_policy_key(key).map(|_| key.as_str()),
        StateItem::IndexedHold { .. } => None,
    }
}

/// The usage a counter's state gives at `now_ms`: what a decision would read. A token
/// bucket drains at its limit's rate (`restore` tells it; without it, nothing drains).
fn usage_of(item: &StateItem, restore: Option<&Restore>, now_ms: i64) -> u64 {
    match item {
        StateItem::Counter { state, .. } => match state {
            // A period that has ended counts nothing, whether or not its key is gone yet.
            CounterState::Calendar { used } => match restore {
                Some(Restore::Calendar { period_end_ms })
                    if (1..=now_ms).contains(period_end_ms) =>
                {
                    0
                }
                _ => *used,
            },
            CounterState::Rolling { buckets } => {
                let oldest = match restore {
                    Some(Restore::Rolling {
                        bucket_ms, buckets, ..
                    }) => now_ms.div_euclid(*bucket_ms) - buckets,
                    _ => i64::MIN,
                };
                buckets
                    .iter()
                    .filter(|(index, _)| *index >= oldest)
                    .map(|(_, units)| units)
                    .sum()
            }
            CounterState::TokenBucket { s, t_ms } => {
                let (period_ms, rate) = match restore {
                    Some(Restore::TokenBucket { period_ms, limit }) => (
                        u128::try_from(*period_ms).unwrap_or(1).max(1),
                        u128::from(*limit),
                    ),
                    _ => (1, 0),
                };
                let drained = u128::try_from(now_ms - t_ms).unwrap_or(0) * rate;
                let left = u128::from(*s).saturating_sub(drained);
                u64::try_from(left.div_ceil(period_ms)).unwrap_or(u64::MAX)
            }
        },
        StateItem::Record { text, .. } => {
            let mut parts = text.split(':').map(str::parse::<i64>);
            match (parts.next(), parts.next(), parts.next()) {
                (Some(Ok(used)), Some(Ok(start)), Some(Ok(end)))
                    if (start..end).contains(&now_ms) =>
                {
                    u64::try_from(used).unwrap_or(0)
                }
                _ => 0,
            }
        }
        StateItem::IndexedHold { .. } => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(state: CounterState) -> StateItem {
        StateItem::Counter {
            key: "q{a}0000000x|u".to_owned(),
            expires_at_ms: i64::MAX,
            state,
        }
    }

    #[test]
    fn usage_is_what_a_decision_would_read_at_that_instant() {
        let rolling = Restore::Rolling {
            bucket: 0,
            bucket_ms: 1_000,
            buckets: 10,
        };
        let buckets = counter(CounterState::Rolling {
            buckets: vec![(5, 3), (20, 4)],
        });
        assert_eq!(
            usage_of(&buckets, Some(&rolling), 21_000),
            4,
            "bucket 5 aged out"
        );
        assert_eq!(usage_of(&buckets, None, 21_000), 7);
        let bucket = Restore::TokenBucket {
            period_ms: 1_000,
            limit: 10,
        };
        // 5 units (5 × 1,000 unit-ms) as of t = 0, draining 10 unit-ms per ms.
        let gcra = counter(CounterState::TokenBucket { s: 5_000, t_ms: 0 });
        assert_eq!(usage_of(&gcra, Some(&bucket), 0), 5);
        assert_eq!(usage_of(&gcra, Some(&bucket), 150), 4, "rounded up");
        assert_eq!(usage_of(&gcra, Some(&bucket), 600), 0);
        let zoned = |text: &str| StateItem::Record {
            key: "q{a}0000000x|u".to_owned(),
            text: text.to_owned(),
            expires_at_ms: i64::MAX,
        };
        assert_eq!(usage_of(&zoned("7:100:200"), None, 150), 7);
        assert_eq!(
            usage_of(&zoned("7:100:200"), None, 200),
            0,
            "the period ended"
        );
        assert_eq!(
            usage_of(&counter(CounterState::Calendar { used: 9 }), None, 0),
            9
        );
    }

    #[test]
    fn only_counters_are_compared() {
        let record = StateItem::Record {
            key: "q{a}#i c3:key".to_owned(),
            text: "kept".to_owned(),
            expires_at_ms: i64::MAX,
        };
        assert_eq!(item_key(&record), None);
        assert_eq!(
            item_key(&counter(CounterState::Calendar { used: 1 })),
            Some("q{a}0000000x|u")
        );
    }
}
