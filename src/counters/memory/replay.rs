//! The in-process store as the rebuild sees it: ledger history replayed into it, and its
//! live state dumped into a snapshot and loaded back (`engine::rebuild::Replay`).

use async_trait::async_trait;

use super::counting::{self, Entry, State};
use super::{lock, MemoryCounterStore};
use crate::engine::rebuild::{Replay, ReplayOp};
use crate::engine::snapshot::{CounterState, StateItem};
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
        check_charges(now_ms, charges)?;
        let Some(first) = charges.first() else {
            return Ok(());
        };
        let mut guard = lock(self.shard(&first.key));
        for charge in charges {
            let entry = guard.entries.get(&charge.key).filter(|e| e.is_live(now_ms));
            if let Some(write) = counting::read(entry, now_ms, charge)?.write {
                counting::apply(&mut guard.entries, charge, now_ms, write);
            }
        }
        Ok(())
    }
}
