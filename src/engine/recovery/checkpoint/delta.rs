//! What a checkpoint saves: the whole state, or only what changed since the checkpoint
//! before it (a delta: the items of the keys that changed, every item of each, and the keys
//! that went), and how a rebuild puts a snapshot and its deltas back together.
//!
//! What changed is found by comparing each key's fingerprint (a hash of its items' bytes)
//! with the one it had at the last save: the state is dumped whole in memory, as before,
//! and what is written is what changed. Fingerprints live in this instance only; the keys
//! that went are written as keys.

use crate::engine::codec;
use crate::engine::state::StateItem;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// After this many deltas the next checkpoint saves the whole state again (10 minutes at
/// the default interval), so that a rebuild applies a bounded chain.
pub(super) const MAX_DELTAS: usize = 60;

/// The key an item is kept under (an open hold: its index's).
fn key_of(item: &StateItem) -> &str {
    match item {
        StateItem::Counter { key, .. } | StateItem::Record { key, .. } => key,
        StateItem::IndexedHold { index_key, .. } => index_key,
    }
}

/// Each key's fingerprint: a hash of its items' encoded bytes (summed over an index's
/// holds, which the dump lists in no set order).
pub(super) fn prints(items: &[StateItem]) -> HashMap<String, u64> {
    let mut prints: HashMap<String, u64> = HashMap::with_capacity(items.len());
    let mut bytes = Vec::new();
    for item in items {
        codec::item_bytes(item, &mut bytes);
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut hasher);
        let print = prints.entry(key_of(item).to_owned()).or_default();
        *print = print.wrapping_add(hasher.finish());
    }
    prints
}

/// What this instance saved last: the chain of checkpoints a delta may follow.
pub(super) struct Chain {
    /// The `covered_seq` of the full snapshot the chain starts from.
    pub(super) base_seq: i64,
    /// The `covered_seq` of the newest checkpoint saved (the snapshot's or a delta's).
    pub(super) head_seq: i64,
    /// Deltas saved since the snapshot.
    deltas: usize,
    /// Their bytes, all together.
    delta_bytes: usize,
    /// The snapshot's bytes.
    full_bytes: usize,
    /// Each key's fingerprint as saved at `head_seq`.
    prints: HashMap<String, u64>,
}

impl Chain {
    /// A chain that starts from a full snapshot covering `base_seq`, of `full_bytes`.
    pub(super) fn started(base_seq: i64, full_bytes: usize, prints: HashMap<String, u64>) -> Self {
        Self {
            base_seq,
            head_seq: base_seq,
            deltas: 0,
            delta_bytes: 0,
            full_bytes,
            prints,
        }
    }

    /// Whether the checkpoint after the state at `covered` may be a delta: it goes on
    /// from the newest one saved, fewer than [`MAX_DELTAS`] follow the snapshot, and they
    /// weigh less than the snapshot did (else a full one reads faster).
    pub(super) fn extends(&self, covered: Option<i64>) -> bool {
        covered == Some(self.head_seq)
            && self.deltas < MAX_DELTAS
            && self.delta_bytes < self.full_bytes
    }

    /// What changed from the state saved to `items` (whose fingerprints are `now`): the
    /// items of every key that is new or changed, and the keys that went.
    pub(super) fn diff(
        &self,
        items: &[StateItem],
        now: &HashMap<String, u64>,
    ) -> (Vec<StateItem>, Vec<String>) {
        let changed: Vec<StateItem> = items
            .iter()
            .filter(|item| {
                let key = key_of(item);
                self.prints.get(key) != now.get(key)
            })
            .cloned()
            .collect();
        let gone = self
            .prints
            .keys()
            .filter(|key| !now.contains_key(*key))
            .cloned()
            .collect();
        (changed, gone)
    }

    /// A delta of `bytes` was saved, covering `head_seq`, the state's fingerprints `prints`.
    pub(super) fn extended(&mut self, head_seq: i64, bytes: usize, prints: HashMap<String, u64>) {
        self.head_seq = head_seq;
        self.deltas += 1;
        self.delta_bytes += bytes;
        self.prints = prints;
    }
}

/// `items` (a snapshot's) with a delta applied: the items of each key it names replace
/// that key's, and the keys that went are dropped.
pub(in crate::engine) fn apply(
    items: Vec<StateItem>,
    (changed, gone): (Vec<StateItem>, Vec<String>),
) -> Vec<StateItem> {
    let mut by_key: HashMap<String, Vec<StateItem>> = HashMap::with_capacity(items.len());
    for item in items {
        by_key
            .entry(key_of(&item).to_owned())
            .or_default()
            .push(item);
    }
    for key in &gone {
        by_key.remove(key);
    }
    let mut replaced: HashMap<String, Vec<StateItem>> = HashMap::new();
    for item in changed {
        replaced
            .entry(key_of(&item).to_owned())
            .or_default()
            .push(item);
    }
    by_key.extend(replaced);
    by_key.into_values().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::CounterState;

    fn counter(key: &str, used: u64) -> StateItem {
        StateItem::Counter {
            key: key.to_owned(),
            expires_at_ms: 1_000,
            state: CounterState::Calendar { used },
        }
    }

    fn hold(id: &str) -> StateItem {
        StateItem::IndexedHold {
            index_key: "ql:{7}#holds".to_owned(),
            hold_id: id.to_owned(),
            expires_at_ms: 500,
        }
    }

    fn sorted(mut items: Vec<StateItem>) -> Vec<String> {
        items.sort_by_key(|item| format!("{item:?}"));
        items.iter().map(|item| format!("{item:?}")).collect()
    }

    #[test]
    fn a_delta_holds_what_changed_and_applied_to_the_snapshot_gives_the_state() {
        let before = vec![
            counter("a", 1),
            counter("b", 2),
            counter("c", 3),
            hold("h1"),
            hold("h2"),
        ];
        let chain = Chain::started(10, 1_000, prints(&before));
        // b changed, c went, d is new, one hold of the index went; a stayed as it was.
        let after = vec![
            counter("a", 1),
            counter("b", 5),
            counter("d", 1),
            hold("h2"),
        ];
        let (changed, gone) = chain.diff(&after, &prints(&after));
        assert_eq!(
            sorted(changed.clone()),
            sorted(vec![counter("b", 5), counter("d", 1), hold("h2")]),
            "a key's items are all in, the index's remaining hold included"
        );
        assert_eq!(gone, vec!["c".to_owned()]);
        assert_eq!(sorted(apply(before, (changed, gone))), sorted(after));
    }

    #[test]
    fn the_same_state_in_another_order_is_no_change() {
        let state = vec![hold("h1"), hold("h2"), counter("a", 1)];
        let chain = Chain::started(10, 1_000, prints(&state));
        let reordered = vec![counter("a", 1), hold("h2"), hold("h1")];
        let (changed, gone) = chain.diff(&reordered, &prints(&reordered));
        assert!(
            changed.is_empty() && gone.is_empty(),
            "{changed:?} {gone:?}"
        );
    }

    #[test]
    fn a_chain_takes_deltas_only_from_its_head_and_up_to_its_bounds() {
        let mut chain = Chain::started(10, 1_000, HashMap::new());
        assert!(chain.extends(Some(10)));
        assert!(!chain.extends(Some(9)), "another state than the one saved");
        assert!(!chain.extends(None));
        chain.extended(20, 400, HashMap::new());
        assert!(chain.extends(Some(20)));
        chain.extended(30, 600, HashMap::new());
        assert!(
            !chain.extends(Some(30)),
            "the deltas weigh as much as the snapshot"
        );
        let mut long = Chain::started(0, usize::MAX, HashMap::new());
        let mut head = 0;
        for _ in 0..MAX_DELTAS {
            head += 1;
            long.extended(head, 1, HashMap::new());
        }
        assert!(!long.extends(Some(head)), "a bounded chain");
    }
}
