//! What one pass of the drain reads: where from ([`Cursor`], [`Source`]) and what it has
//! read and not yet moved ([`Pass`]).

use crate::domain::LedgerEntry;
use crate::engine::codec;
use crate::engine::pipeline::stream::StreamEntry;
use crate::keys::{ledger_stream, SHARDS};
use crate::logs::Throttle;

/// Where a pass reads a stream's entries from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// This consumer's entries left unacknowledged by a failed pass.
    Pending,
    /// Entries never delivered.
    New,
    /// Entries another (dead) consumer left idle for `claim_idle`.
    Idle,
}

/// What a pass has read and not yet moved: one transaction's worth at most.
#[derive(Default)]
pub(super) struct Pass {
    pub(super) entries: Vec<LedgerEntry>,
    /// For each of `entries`, its stream (an index into `streams`) and its id there.
    pub(super) origins: Vec<(usize, String)>,
    pub(super) streams: Vec<String>,
    /// The write generation of a stream's shard read after each batch of it.
    pub(super) generations: Vec<(String, u64)>,
}

/// Where a pass is in its reading: the streams and sources it reads, in order, and the
/// position in the current one.
pub(super) struct Cursor {
    /// Each stream to read, with where from: per shard, its pending entries (after a
    /// failed pass), its new ones, and the idle ones of dead consumers (when claiming).
    pub(super) work: Vec<(String, Source)>,
    /// The one being read.
    pub(super) next: usize,
    /// Pending entries are paged by id: the last one read.
    pub(super) after: String,
}

impl Cursor {
    pub(super) fn over(prefix: &str, shards: u64, retry: u64, claim: u64) -> Self {
        let mut work = Vec::new();
        for shard in (0..SHARDS).filter(|s| shards & (1 << s) != 0) {
            let stream = ledger_stream(prefix, shard);
            let bit = 1u64 << shard;
            let sources = [
                (retry & bit != 0).then_some(Source::Pending),
                Some(Source::New),
                (claim & bit != 0).then_some(Source::Idle),
            ];
            for source in sources.into_iter().flatten() {
                work.push((stream.clone(), source));
            }
        }
        Self {
            work,
            next: 0,
            after: String::from("0"),
        }
    }

    /// Whether every stream has been read to its end.
    pub(super) fn is_done(&self) -> bool {
        self.next >= self.work.len()
    }
}

impl Pass {
    pub(super) fn add(&mut self, stream: &str, batch: Vec<StreamEntry>) {
        if self.streams.last().map(String::as_str) != Some(stream) {
            self.streams.push(stream.to_owned());
        }
        let at = self.streams.len() - 1;
        for (id, text) in batch {
            match codec::decode_entries(&text) {
                Ok(entries) => {
                    for entry in entries {
                        self.entries.push(entry);
                        self.origins.push((at, id.clone()));
                    }
                }
                // Written by our own script from our own JSON: a bug. Keep it in Redis,
                // pending, for an operator, rather than losing it.
                Err(error) => {
                    static SITE: Throttle = Throttle::new();
                    if let Some(count) = SITE.event() {
                        tracing::error!(error = %error, stream, id, count, "unreadable ledger entry left pending");
                    }
                }
            }
        }
    }
}

/// The shards the `entries` read from `stream` changed: the stream's own, then those of
/// the budgets shared by subjects they charged or gave back to (a charge names its
/// counters; a refund, void or settlement names its policies' scopes), each once.
pub(super) fn shards_charged(stream: &str, entries: &[LedgerEntry]) -> Vec<u16> {
    let mut shards: Vec<u16> = crate::keys::shard_of(stream).into_iter().collect();
    let mut note = |shard: u16| {
        if !shards.contains(&shard) {
            shards.push(shard);
        }
    };
    for entry in entries {
        for counter in &entry.counters {
            if let Some(shard) = crate::keys::shard_of(&counter.key) {
                note(shard);
            }
        }
        let shared = entry.policies.iter().filter(|p| !p.scope.has_subject());
        for policy in shared {
            let budget = entry.budget(&policy.scope);
            note(crate::keys::budget_shard(entry.action.as_str(), &budget));
        }
    }
    shards
}
