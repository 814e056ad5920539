//! Write generations: a Redis that came back older than the ledger is caught before it
//! decides.
//!
//! A Redis restarted from its last RDB snapshot (or from an AOF a second behind, or a
//! replica promoted without the last writes) serves the counters and idempotency records
//! of an earlier moment, while the SQL ledger holds entries made after it: deciding on them
//! would charge a retried payment twice. So each shard has a write generation
//! (`keys::generation`), which every script that changes the shard increments in the same
//! atomic step. Once the drain has committed a batch of a shard's stream to SQL, it records
//! the shard's generation, read right after the batch (so at least that of every entry in
//! it), in `redis_generations`: the shard's **floor**. Every script is given the floors of
//! the shards it touches, and refuses a shard whose generation is below its floor as it
//! refuses one without an epoch: it deletes the epoch and answers `-2`, and the shard is
//! rebuilt from the ledger (which first drains what the streams still hold, then replays).
//! A rebuild sets the generation to the floor as it opens the shard.
//!
//! Each instance keeps the floors in memory: its own drain raises them at once, and the
//! drain reads everyone's from SQL at start and every second (`FLOORS_EVERY` in
//! `engine::pipeline::drain`). They never go
//! down. A shard without a generation key is not checked: a Redis that lost its data has no
//! epoch either, and a shard an earlier release rebuilt has none until it is changed.
//!
//! Entries Redis had not drained when it went back cannot come back (the contract says so);
//! what this catches is deciding again on an older state, not the loss.

use crate::keys;
use std::sync::atomic::{AtomicU64, Ordering};

/// The floor of each shard's write generation, as this instance knows it.
#[derive(Debug)]
pub(crate) struct Floors {
    shards: Vec<AtomicU64>,
}

impl Default for Floors {
    fn default() -> Self {
        Self {
            shards: (0..keys::SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Floors {
    /// Raises `shard`'s floor to `generation` (a lower one changes nothing).
    pub(crate) fn raise(&self, shard: u16, generation: u64) {
        if let Some(floor) = self.shards.get(usize::from(shard)) {
            floor.fetch_max(generation, Ordering::Relaxed);
        }
    }

    /// `shard`'s floor (0 for a shard out of range).
    pub(crate) fn of(&self, shard: u16) -> u64 {
        self.shards
            .get(usize::from(shard))
            .map_or(0, |floor| floor.load(Ordering::Relaxed))
    }

    /// The floors of the shards of `epochs` (their epochs' keys), as the scripts take them:
    /// decimal, comma-separated, in order.
    pub(crate) fn argument<'a>(&self, epochs: impl IntoIterator<Item = &'a str>) -> String {
        let mut out = String::new();
        for (i, epoch) in epochs.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let floor = keys::shard_of(epoch).map_or(0, |shard| self.of(shard));
            out.push_str(itoa::Buffer::new().format(floor));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_only_go_up_and_are_given_in_the_order_of_the_epochs() {
        let floors = Floors::default();
        floors.raise(3, 10);
        floors.raise(3, 7);
        floors.raise(5, 2);
        floors.raise(keys::SHARDS, 99);
        assert_eq!(floors.of(3), 10);
        let (three, five, one) = (
            keys::epoch("ql", 3),
            keys::epoch("ql", 5),
            keys::epoch("ql", 1),
        );
        assert_eq!(
            floors.argument([three.as_str(), five.as_str(), one.as_str()]),
            "10,2,0"
        );
        assert_eq!(floors.argument(std::iter::empty()), "");
        assert_eq!(
            keys::generation("ql", 3),
            three.replace("#epoch", "#gen"),
            "the scripts name the generation from the epoch's key"
        );
    }
}
