//! `counters verify` with Redis counters: each shard's live counters compared with its
//! ledger at one instant, while traffic flows.
//!
//! On Redis the ledger is SQL plus the entries still waiting in the shards' streams: a
//! script charges and appends its entry to its shard's stream in one atomic step, and the
//! drain inserts entries into SQL before it deletes them from the stream. A verify:
//!
//! 1. lists the counters Redis holds, and replays the ledger's horizon from SQL into a
//!    scratch store (the bulk of the work, while the drain goes on);
//! 2. **holds deletions** from every stream (`ShardStates::hold_deletes`): the drain still
//!    inserts and acknowledges, but what it drains stays in its stream;
//! 3. replays what SQL received since step 1;
//! 4. per shard, reads the shard's stream and counters **at one instant** (one script);
//!    the entries of the stream that those replays did not read are replayed, and the shard's
//!    counters are compared with the replay's, as usage at one instant;
//! 5. lets deletions go on (and deletes what was held).
//!
//! Every entry appended to a shard's stream before its instant is then in SQL as read in
//! step 1 or 3, or still in the stream (nothing left it since step 2); none appended after
//! it was read (SQL was read before). A consume in flight has changed both sides or
//! neither, so it never shows as drift.
//!
//! A budget shared by subjects is charged by entries of every shard's stream. On a
//! standalone Redis, when such a budget exists, every shard is read in one script. On a
//! Redis Cluster such budgets are charged across slots in steps (`engine::crossslot`), so
//! no instant has them settled: they are left out of the comparison (and of `checked`), and
//! so are, for this verify, the home counters of a consume across slots still in flight
//! (its intent is open: it charged them, and its entry comes with its finalize).

use super::rebuild::{Replay, Replayer};
use super::shards::ShardStates;
use super::snapshot::StateItem;
use super::verify::{Known, Verified, VerifyError};
use super::{codec, Engine, EngineError};
use crate::domain::{Action, LedgerEntry};
use crate::keys;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// How long a verify may hold deletions: its cut must be read by then, or it cannot tell.
const HOLD_MS: u64 = 60_000;

/// How many times a shard is read again when its stream names counters the read missed
/// (created by consumes after the counters were listed).
const REREADS: usize = 3;

/// Some shards' streams and counters, read at one instant.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    /// The streams' entries (stream id, encoded entries), in stream order.
    pub(crate) entries: Vec<(String, String)>,
    /// The counters' states (absent counters have none).
    pub(crate) items: Vec<StateItem>,
    /// The records of the shards' intents (consumes across Redis Cluster slots).
    pub(crate) intents: Vec<String>,
}

impl Cut {
    /// The counters charged by consumes still in flight across slots: an open intent has
    /// charged its home counters, and its entry comes with its finalize.
    fn in_flight(&self) -> impl Iterator<Item = String> + '_ {
        self.intents
            .iter()
            .filter_map(|text| codec::decode_intent(text).ok())
            .filter(|(state, _)| state == "open")
            .flat_map(|(_, record)| record.home.into_iter().map(|counter| counter.key))
    }
}

impl Engine {
    /// `counters verify` of a store that streams the ledger (Redis): see the module doc.
    pub(super) async fn verify_streamed(
        &self,
        shards: &Arc<dyn ShardStates>,
        scratch: &super::shards::ScratchStore,
        action: Option<&Action>,
        learn: &(dyn Fn(&LedgerEntry) -> bool + Sync),
        known: &Mutex<HashMap<String, Known>>,
    ) -> Result<Verified, VerifyError> {
        let listed = shards.counter_keys().await.map_err(EngineError::from)?;
        let target = scratch();
        let mut replayer = Replayer::after(None);
        self.replay_pages(&mut replayer, target.as_ref(), None, learn)
            .await?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        shards
            .hold_deletes(&token, HOLD_MS)
            .await
            .map_err(EngineError::from)?;
        let read = self
            .read_cuts(
                shards,
                &token,
                target.as_ref(),
                &mut replayer,
                listed,
                learn,
                known,
            )
            .await;
        if let Err(error) = shards.release_deletes(&token).await {
            // The hold expires by itself; the next acknowledgement deletes what it held.
            tracing::warn!(error = %error, "letting the ledger streams' deletions go on failed");
        }
        let (live, in_flight, now_ms) = read?;
        let ledger = target.dump(now_ms).await;
        let known = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // On a cluster, budgets shared by subjects are never settled at one instant.
        // And counters charged by a consume across slots in flight are not settled yet.
        let compared = |item: &StateItem| {
            super::verify::item_key(item).is_none_or(|key| {
                !in_flight.contains(key)
                    && (self.counters.atomic_across_tags()
                        || known.get(key).is_none_or(|k| !k.shared))
            })
        };
        let live: Vec<StateItem> = live.into_iter().filter(|i| compared(i)).collect();
        let ledger: Vec<StateItem> = ledger.into_iter().filter(|i| compared(i)).collect();
        Ok(self.compare(&live, &ledger, &known, action, now_ms))
    }

    /// Steps 3 and 4 of the module doc: the live items of every shard, and the instant
    /// their usage is compared at; the ledger's side is replayed into `target`.
    #[expect(clippy::too_many_arguments, reason = "one step of verify_streamed")]
    async fn read_cuts(
        &self,
        shards: &Arc<dyn ShardStates>,
        token: &str,
        target: &dyn Replay,
        replayer: &mut Replayer,
        mut listed: BTreeMap<u16, Vec<String>>,
        learn: &(dyn Fn(&LedgerEntry) -> bool + Sync),
        known: &Mutex<HashMap<String, Known>>,
    ) -> Result<(Vec<StateItem>, BTreeSet<String>, i64), VerifyError> {
        self.replay_pages(replayer, target, None, learn).await?;
        let groups: Vec<Vec<u16>> =
            match self.counters.atomic_across_tags() && self.cache.has_shared_budgets() {
                true => vec![(0..keys::SHARDS).collect()],
                false => (0..keys::SHARDS).map(|shard| vec![shard]).collect(),
            };
        let now_ms = self.now().timestamp_millis();
        let (mut live, mut in_flight, mut all_streamed) = (Vec::new(), BTreeSet::new(), Vec::new());
        for group in groups {
            let mut counters: BTreeSet<String> = group
                .iter()
                .filter_map(|shard| listed.remove(shard))
                .flatten()
                .collect();
            counters.extend(self.known_in(known, &group));
            let mut rereads = 0;
            let (cut, streamed) = loop {
                let list: Vec<String> = counters.iter().cloned().collect();
                let cut = shards
                    .read_cut(token, &group, &list, now_ms)
                    .await
                    .map_err(EngineError::from)?
                    .ok_or(VerifyError::Unsettled(
                        "the verify held the ledger streams too long",
                    ))?;
                let streamed = self.not_replayed(&cut, replayer.last_seq()).await?;
                let missed: Vec<String> = streamed
                    .iter()
                    .flat_map(|entry| &entry.counters)
                    .map(|counter| counter.key.clone())
                    .filter(|key| in_group(key, &group) && !counters.contains(key))
                    .collect();
                if missed.is_empty() || rereads == REREADS {
                    break (cut, streamed);
                }
                counters.extend(missed);
                rereads += 1;
            };
            for entry in &streamed {
                learn(entry);
            }
            all_streamed.extend(streamed);
            in_flight.extend(cut.in_flight());
            live.extend(cut.items);
        }
        self.replay_streamed(replayer, target, all_streamed).await?;
        Ok((live, in_flight, now_ms))
    }

    /// The counters of `group`'s shards the ledger knows of.
    fn known_in(&self, known: &Mutex<HashMap<String, Known>>, group: &[u16]) -> Vec<String> {
        known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .filter(|key| in_group(key, group))
            .cloned()
            .collect()
    }

    /// The entries of `cut`'s streams that the replay of SQL up to the one numbered
    /// `replayed` did not read, in stream order: those SQL does not hold, and those it
    /// received since (the drain goes on, but they stay in the streams).
    async fn not_replayed(
        &self,
        cut: &Cut,
        replayed: Option<i64>,
    ) -> Result<Vec<LedgerEntry>, VerifyError> {
        let mut entries = Vec::new();
        for (id, text) in &cut.entries {
            match codec::decode_entries(text) {
                Ok(decoded) => entries.extend(decoded),
                Err(error) => {
                    // The drain leaves it pending too: an operator's matter, not drift.
                    tracing::warn!(id, error = %error, "a ledger stream entry does not decode");
                }
            }
        }
        let ids: Vec<String> = entries.iter().map(|e| e.id.to_string()).collect();
        let seqs = self.ledger.seqs_of(&ids).await.map_err(EngineError::from)?;
        entries.retain(|entry| {
            seqs.get(&entry.id.to_string())
                .is_none_or(|seq| replayed.is_none_or(|replayed| *seq > replayed))
        });
        Ok(entries)
    }
}

/// Whether `key` sits in one of `group`'s shards.
fn in_group(key: &str, group: &[u16]) -> bool {
    keys::shard_of_tag(keys::hash_tag(key)).is_some_and(|shard| group.contains(&shard))
}
