//! The in-process store as the rebuild sees it: ledger history replayed into it, and its
//! live state dumped into a snapshot and loaded back (`engine::state::Replay`).

use async_trait::async_trait;

use super::counting::{self, Entry, State};
use super::{lock, MemoryCounterStore};
use crate::engine::state::{CounterState, StateItem};
use crate::engine::state::{Replay, ReplayOp};
use crate::engine::store::{check_charges, Charge, CounterStore, StoreError};

#[async_trait]
impl Replay for MemoryCounterStore {
    async fn replay(&self, ops: Vec<ReplayOp>) -> Result<(), StoreError> {
        for op in ops {
            match op {
                ReplayOp::Charge { at_ms, charges } => self.force(at_ms, &charges)?,
                ReplayOp::GiveBack { at_ms, request } => {
                    self.give_back(at_ms, &request).await?;
                }
                ReplayOp::Record {
                    key,
                    text,
                    expires_at_ms,
                } => {
                    let mut guard = lock(self.shard(&key));
                    counting::set_text(&mut guard.entries, &key, text, expires_at_ms);
                }
                ReplayOp::IndexHold {
                    index_key,
                    hold_id,
                    expires_at_ms,
                } => {
                    let mut guard = lock(self.shard(&index_key));
                    counting::index_add(&mut guard.entries, &index_key, &hold_id, expires_at_ms);
                }
            }
        }
        Ok(())
    }

    async fn dump(&self, now_ms: i64) -> Vec<StateItem> {
        let mut items = Vec::new();
        for shard in self.shards.iter() {
            let guard = lock(shard);
            for (key, entry) in &guard.entries {
                if entry.is_live(now_ms) {
                    dump_entry(key, entry, &mut items);
                }
            }
        }
        items
    }

    async fn load(&self, items: Vec<StateItem>, taken_at_ms: i64) -> usize {
        let mut kept = 0;
        for item in items {
            let (key, entry) = match item {
                StateItem::IndexedHold {
                    index_key,
                    hold_id,
                    expires_at_ms,
                } => {
                    let mut guard = lock(self.shard(&index_key));
                    counting::index_add(&mut guard.entries, &index_key, &hold_id, expires_at_ms);
                    kept += 1;
                    continue;
                }
                StateItem::Record {
                    key,
                    text,
                    expires_at_ms,
                } => (key, Entry::new(State::Text(text), expires_at_ms)),
                StateItem::Counter {
                    key,
                    expires_at_ms,
                    state,
                } => (key, Entry::new(counter_state(state), expires_at_ms)),
            };
            if entry.is_live(taken_at_ms) {
                lock(self.shard(&key)).entries.insert(key, entry);
                kept += 1;
            }
        }
        kept
    }
}

/// The items of one live entry: one, or one per hold of an index.
fn dump_entry(key: &str, entry: &Entry, items: &mut Vec<StateItem>) {
    let expires_at_ms = entry.expires_at_ms;
    let counter = |state| StateItem::Counter {
        key: key.to_owned(),
        expires_at_ms,
        state,
    };
    match &entry.state {
        State::Counter(used) => items.push(counter(CounterState::Calendar { used: *used })),
        State::Buckets(buckets) => items.push(counter(CounterState::Rolling {
            buckets: buckets.clone(),
        })),
        State::Gcra { s, t } => items.push(counter(CounterState::TokenBucket { s: *s, t_ms: *t })),
        State::Text(text) => items.push(StateItem::Record {
            key: key.to_owned(),
            text: text.clone(),
            expires_at_ms,
        }),
        State::Index(members) => {
            items.extend(
                members
                    .iter()
                    .map(|(hold_id, score)| StateItem::IndexedHold {
                        index_key: key.to_owned(),
                        hold_id: hold_id.clone(),
                        expires_at_ms: *score,
                    }),
            );
        }
    }
}

/// A counter's state as the store keeps it.
fn counter_state(state: CounterState) -> State {
    match state {
        CounterState::Calendar { used } => State::Counter(used),
        CounterState::Rolling { buckets } => State::Buckets(buckets),
        CounterState::TokenBucket { s, t_ms } => State::Gcra { s, t: t_ms },
    }
}

impl MemoryCounterStore {
    /// Puts every charge's cost on its counter at `now_ms`, whatever the limits.
    fn force(&self, now_ms: i64, charges: &[Charge]) -> Result<(), StoreError> {
        check_charges(now_ms, charges, true)?;
        if charges.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = charges.iter().map(|c| c.key.as_str()).collect();
        self.with_keys(&keys, |shard| {
            for charge in charges {
                let entry = shard
                    .entries
                    .get(charge.key.as_str())
                    .filter(|e| e.is_live(now_ms));
                if let Some(write) = counting::read(entry, now_ms, charge)?.write {
                    counting::apply(&mut shard.entries, charge, now_ms, write);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::store::{Algorithm, Consume, Effects};

    const T0: i64 = 1_800_000_000_000;

    fn charge(key: &str, algorithm: Algorithm, cost: u64) -> Charge {
        Charge {
            key: crate::keys::CounterKey::read(key),
            algorithm,
            limit: 1_000,
            cost,
            enforce: true,
        }
    }

    /// A calendar, a rolling and a token-bucket charge of `ql:{a}`, costing `costs`.
    fn three_charges(costs: [u64; 3]) -> [Charge; 3] {
        [
            charge(
                "ql:{a}:cal",
                Algorithm::Calendar {
                    period_end_ms: T0 + 60_000,
                },
                costs[0],
            ),
            charge(
                "ql:{a}:roll",
                Algorithm::Rolling {
                    bucket_ms: 1_000,
                    buckets: 60,
                },
                costs[1],
            ),
            charge(
                "ql:{a}:tok",
                Algorithm::TokenBucket { period_ms: 60_000 },
                costs[2],
            ),
        ]
    }

    /// A store with a counter of each kind, a record and an indexed hold.
    async fn filled() -> MemoryCounterStore {
        let store = MemoryCounterStore::new();
        let charges = three_charges([7, 5, 3]);
        store
            .decide(&Consume {
                now_ms: T0,
                charges: &charges,
                commit: true,
                effects: &Effects::default(),
            })
            .await
            .expect("decides");
        let ops = vec![
            ReplayOp::Record {
                key: "ql:{a}#i:k".to_owned(),
                text: "kept".to_owned(),
                expires_at_ms: T0 + 1_000,
            },
            ReplayOp::Record {
                key: "ql:{a}#gone".to_owned(),
                text: "expired".to_owned(),
                expires_at_ms: T0 - 1,
            },
            ReplayOp::IndexHold {
                index_key: "ql:{7}#holds".to_owned(),
                hold_id: "h.7".to_owned(),
                expires_at_ms: T0 - 5,
            },
        ];
        store.replay(ops).await.expect("replays");
        store
    }

    fn sorted(mut items: Vec<StateItem>) -> Vec<String> {
        let mut items: Vec<String> = items.drain(..).map(|i| format!("{i:?}")).collect();
        items.sort();
        items
    }

    #[tokio::test]
    async fn a_loaded_dump_holds_every_live_entry_and_counts_on_from_it() {
        let store = filled().await;
        let items = store.dump(T0).await;
        assert_eq!(
            items.len(),
            5,
            "three counters, a record, a hold: {items:?}"
        );
        let copy = MemoryCounterStore::new();
        assert_eq!(copy.load(items.clone(), T0).await, 5);
        assert_eq!(sorted(copy.dump(T0).await), sorted(items));

        let later = T0 + 50;
        let look = three_charges([1, 1, 1]);
        for target in [&store, &copy] {
            let evaluation = target.evaluate(later, &look, false).await.expect("peeks");
            let used: Vec<u64> = evaluation.outcomes.iter().map(|o| o.used).collect();
            assert_eq!(used, [7, 5, 3]);
            let kept = target.record("ql:{a}#i:k", later).await.expect("reads");
            assert_eq!(kept.as_deref(), Some("kept"));
            let due = target.expired_holds("ql:{7}#holds", T0, 10).await;
            assert_eq!(due.expect("reads"), ["h.7"], "due holds stay indexed");
        }
    }

    #[tokio::test]
    async fn load_drops_what_was_gone_when_the_snapshot_was_taken() {
        let items = vec![
            StateItem::Record {
                key: "ql:{a}#old".to_owned(),
                text: "x".to_owned(),
                expires_at_ms: T0 - 1,
            },
            StateItem::Record {
                key: "ql:{a}#new".to_owned(),
                text: "y".to_owned(),
                expires_at_ms: T0,
            },
        ];
        let store = MemoryCounterStore::new();
        assert_eq!(store.load(items, T0).await, 1);
        assert_eq!(store.dump(T0 - 10).await.len(), 1);
    }
}
