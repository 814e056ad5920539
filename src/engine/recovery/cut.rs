//! `counters verify` with Redis counters: each shard's live counters compared with its
//! ledger at one instant, while traffic flows.
//!
//! On Redis the ledger is SQL plus the entries still waiting in the shards' streams: a
//! script charges and appends its entry to its shard's stream in one atomic step, and the
//! drain inserts entries into SQL before it deletes them from the stream. A verify:
//!
//! 1. lists the counters Redis holds, and replays the ledger's horizon from SQL into a
//!    scratch store (the bulk of the work, while the drain goes on), up to the `seq`
//!    every entry below which is settled (`LedgerStore::settled_seq`: appends run several
//!    at a time, and one may commit higher `seq`s before another commits lower ones);
//! 2. **holds deletions** from every stream (`ShardStates::hold_deletes`): the drain still
//!    inserts and acknowledges, but what it drains stays in its stream;
//! 3. replays what SQL received since step 1, up to the `seq` settled now;
//! 4. per shard, reads the shard's stream and counters **at one instant** (one script);
//!    the entries of the stream that those replays did not read are replayed, and the shard's
//!    counters are compared with the replay's, as usage at one instant;
//! 5. lets deletions go on (and deletes what was held).
//!
//! Every entry appended to a shard's stream before its instant is then in SQL as read in
//! step 1 or 3 (its `seq` is at most the settled one), or still in the stream (nothing
//! left it since step 2), where an entry with a higher `seq`, or none, is replayed from;
//! none appended after it was read (SQL was read before). A consume in flight has changed both sides or
//! neither, so it never shows as drift.
//!
//! A budget shared by subjects (its scope does not name the subject) is charged by entries
//! of every shard's stream. When such a budget exists, those budgets are compared with a
//! replay of their own (the entries that charge them, and every give-back). On a standalone
//! Redis they are read with every stream at one instant, in one script (the budgets are
//! few; the streams hold what was appended since the hold).
//!
//! On a Redis Cluster no script reads several slots, and such budgets are charged across
//! slots in steps (`engine::crossslot`). Every step that changes a shard's counters across
//! slots (an intent opened or abandoned, a reservation made or undone, a share given back)
//! increments the shard's version (`keys::cross_slot_version`). The verify reads the
//! versions of the shared budgets' shards, then every shard (stream, index of intents and
//! shared budgets) one by one, then the versions again ([`Recovery::settled_cut`]). When no
//! version moved and no index held an intent, no step across slots ran or was in flight
//! meanwhile: each shared budget, read at its shard's instant, equals the ledger read at
//! the shards' instants. Otherwise it tries again, a few times; if it never settles, the
//! shared budgets are not compared (`not_compared`, and the CLI cannot tell). Also on a
//! cluster, the home counters of a consume across slots still in flight (its intent is
//! open: it charged them, and its entry comes with its finalize) are left out of this
//! verify.

use crate::domain::{Action, CounterCharge, LedgerEntry};
use crate::engine::recovery::rebuild::Replayer;
use crate::engine::recovery::verify::{KnownByKey, Learn, Verified, VerifyError};
use crate::engine::recovery::Recovery;
use crate::engine::shards::{Cut, ShardStates};
use crate::engine::state::Replay;
use crate::engine::state::StateItem;
use crate::engine::{codec, EngineError};
use crate::keys;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// How long a verify may hold deletions: its cut must be read by then, or it cannot tell.
const HOLD_MS: u64 = 60_000;

/// How many times the budgets shared by subjects are read on a Redis Cluster before the
/// verify gives up comparing them (`Engine::settled_cut`).
const SETTLE_TRIES: u64 = 5;

/// How many times a shard is read again when its stream names counters the read missed
/// (created by consumes after the counters were listed).
const REREADS: usize = 3;

/// One replay of the ledger to compare live counters with: a scratch store and how far
/// its replay went.
struct Side {
    target: Arc<dyn Replay>,
    replayer: Replayer,
}

/// What the cuts read: the live items of each side, the counters in flight, and the
/// instant usage is compared at.
struct Read {
    own: Vec<StateItem>,
    wide: Vec<StateItem>,
    in_flight: BTreeSet<String>,
    now_ms: i64,
    /// The budgets shared by subjects were never settled (a Redis Cluster).
    unsettled: bool,
}

/// Whether the replay of budgets shared by subjects needs `entry`: a charge or hold of
/// one, or any give-back (a refund or settlement names its charge's counters only through
/// the charge; one of another budget finds nothing to give back to).
fn wide_wants(entry: &LedgerEntry) -> bool {
    entry.counters.is_empty() || entry.counters.iter().any(shared_budget)
}

/// Whether `counter` is a budget shared by subjects: its scope does not name the subject,
/// so entries of every shard charge it.
fn shared_budget(counter: &CounterCharge) -> bool {
    !counter.scope.has_subject()
}

impl Recovery {
    /// `counters verify` of a store that streams the ledger (Redis): see the module doc.
    pub(crate) async fn verify_streamed(
        &self,
        shards: &Arc<dyn ShardStates>,
        action: Option<&Action>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Verified, VerifyError> {
        let listed = shards.counter_keys().await.map_err(EngineError::from)?;
        let mut own = Side {
            target: (self.scratch)(),
            replayer: Replayer::after(None),
        };
        // Budgets shared by subjects get a replay of their own.
        let mut wide = self.cache.has_shared_budgets().then(|| Side {
            target: (self.scratch)(),
            replayer: Replayer::after(None),
        });
        self.replay_settled(&mut own, wide.as_mut(), learn).await?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        shards
            .hold_deletes(&token, HOLD_MS)
            .await
            .map_err(EngineError::from)?;
        let read = self
            .read_cuts(
                shards,
                &token,
                (&mut own, wide.as_mut()),
                listed,
                learn,
                known,
            )
            .await;
        if let Err(error) = shards.release_deletes(&token).await {
            // The hold expires by itself; the next acknowledgement deletes what it held.
            tracing::warn!(error = %error, "letting the ledger streams' deletions go on failed");
        }
        let read = read?;
        let own_ledger = own.target.dump(read.now_ms).await;
        let wide_ledger = match &wide {
            Some(wide) => Some(wide.target.dump(read.now_ms).await),
            None => None,
        };
        let known = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Counters charged by a consume across slots in flight are not settled yet; each
        // side compares its own counters (on a cluster, shared budgets are on neither).
        let side = |items: Vec<StateItem>, shared: bool| -> Vec<StateItem> {
            items
                .into_iter()
                .filter(|item| {
                    crate::engine::recovery::verify::item_key(item).is_none_or(|key| {
                        !read.in_flight.contains(key)
                            && known.get(key).is_some_and(|k| k.shared) == shared
                    })
                })
                .collect()
        };
        let ledger = side(own_ledger, false);
        let mut verified =
            self.compare(&side(read.own, false), &ledger, &known, action, read.now_ms);
        if read.unsettled {
            verified.not_compared = known.values().filter(|k| k.shared && k.of(action)).count();
        } else if let Some(wide_ledger) = wide_ledger {
            let ledger = side(wide_ledger, true);
            let shared = self.compare(&side(read.wide, true), &ledger, &known, action, read.now_ms);
            verified.checked += shared.checked;
            verified.drift.extend(shared.drift);
        }
        Ok(verified)
    }

    /// Steps 3 and 4 of the module doc: each shard's own counters at its instant, replayed
    /// into `own`; with `wide`, the budgets shared by subjects and every stream at one
    /// instant, replayed into `wide`.
    async fn read_cuts(
        &self,
        shards: &Arc<dyn ShardStates>,
        token: &str,
        (own, mut wide): (&mut Side, Option<&mut Side>),
        mut listed: BTreeMap<u16, Vec<String>>,
        learn: &Learn<'_>,
        known: &KnownByKey,
    ) -> Result<Read, VerifyError> {
        self.replay_settled(own, wide.as_deref_mut(), learn).await?;
        let shared_known: BTreeSet<String> = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(_, k)| k.shared)
            .map(|(key, _)| key.clone())
            .collect();
        let now_ms = self.now().timestamp_millis();
        let mut read = Read {
            own: Vec::new(),
            wide: Vec::new(),
            in_flight: BTreeSet::new(),
            now_ms,
            unsettled: false,
        };
        let mut streamed_own = Vec::new();
        for shard in 0..keys::SHARDS {
            let group = [shard];
            let mut counters: BTreeSet<String> = listed
                .remove(&shard)
                .unwrap_or_default()
                .into_iter()
                .collect();
            counters.extend(self.known_in(known, &group));
            counters.retain(|key| !shared_known.contains(key));
            let (cut, streamed) = self
                .cut_of(shards, token, &group, counters, &own.replayer, false)
                .await?;
            read.in_flight.extend(cut.in_flight());
            read.own.extend(cut.items);
            streamed_own.extend(streamed);
        }
        for entry in &streamed_own {
            learn(entry);
        }
        self.replay_streamed(&mut own.replayer, own.target.as_ref(), streamed_own)
            .await?;
        if let Some(wide) = wide {
            if self.decider.one_slot_per_call() {
                match self
                    .settled_cut(shards, token, &wide.replayer, shared_known)
                    .await?
                {
                    Some((items, streamed)) => {
                        for entry in &streamed {
                            learn(entry);
                        }
                        read.wide = items;
                        self.replay_streamed(&mut wide.replayer, wide.target.as_ref(), streamed)
                            .await?;
                    }
                    None => read.unsettled = true,
                }
                return Ok(read);
            }
            let every: Vec<u16> = (0..keys::SHARDS).collect();
            let (cut, streamed) = self
                .cut_of(shards, token, &every, shared_known, &wide.replayer, true)
                .await?;
            for entry in &streamed {
                learn(entry);
            }
            read.wide = cut.items;
            self.replay_streamed(&mut wide.replayer, wide.target.as_ref(), streamed)
                .await?;
        }
        Ok(read)
    }

    /// `group`'s streams and `counters` at one instant, read again (a few times at most)
    /// when the streams name counters of the group the read missed (created since they were
    /// listed): budgets shared by subjects if `shared`, the others if not. With the entries
    /// of the streams that `replayer` did not read from SQL.
    async fn cut_of(
        &self,
        shards: &Arc<dyn ShardStates>,
        token: &str,
        group: &[u16],
        mut counters: BTreeSet<String>,
        replayer: &Replayer,
        shared: bool,
    ) -> Result<(Cut, Vec<LedgerEntry>), VerifyError> {
        let mut rereads = 0;
        loop {
            let list: Vec<String> = counters.iter().cloned().collect();
            let cut = shards
                .read_cut(token, group, &list, self.now().timestamp_millis())
                .await
                .map_err(EngineError::from)?
                .ok_or(VerifyError::Unsettled(
                    "the verify held the ledger streams too long",
                ))?;
            let streamed = self.not_replayed(&cut, replayer.last_seq()).await?;
            let missed: Vec<String> = streamed
                .iter()
                .flat_map(|entry| {
                    entry
                        .counters
                        .iter()
                        .filter(move |c| shared_budget(c) == shared)
                })
                .map(|counter| counter.key.clone())
                .filter(|key| in_group(key, group) && !counters.contains(key))
                .collect();
            if missed.is_empty() || rereads == REREADS {
                return Ok((cut, streamed));
            }
            counters.extend(missed);
            rereads += 1;
        }
    }

    /// On a Redis Cluster, the budgets shared by subjects (`shared`) and every stream, read
    /// shard by shard while no step across slots changed those budgets' shards and none was
    /// in flight: then every shared budget is settled, each at its shard's instant, and
    /// equals the ledger read at those instants. Read again a few times while that does
    /// not hold; `None` if it never did (the budgets are then not compared).
    async fn settled_cut(
        &self,
        shards: &Arc<dyn ShardStates>,
        token: &str,
        replayer: &Replayer,
        shared: BTreeSet<String>,
    ) -> Result<Option<(Vec<StateItem>, Vec<LedgerEntry>)>, VerifyError> {
        let homes: BTreeSet<u16> = shared
            .iter()
            .filter_map(|key| keys::shard_of_tag(keys::hash_tag(key)))
            .collect();
        let homes: Vec<u16> = homes.into_iter().collect();
        for attempt in 0..SETTLE_TRIES {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
            }
            let before = shards
                .cross_slot_versions(&homes)
                .await
                .map_err(EngineError::from)?;
            let (mut items, mut streamed, mut in_flight) = (Vec::new(), Vec::new(), false);
            for shard in 0..keys::SHARDS {
                let group = [shard];
                let counters = shared
                    .iter()
                    .filter(|key| in_group(key, &group))
                    .cloned()
                    .collect();
                let (cut, entries) = self
                    .cut_of(shards, token, &group, counters, replayer, true)
                    .await?;
                in_flight |= !cut.intents.is_empty();
                items.extend(cut.items);
                streamed.extend(entries);
            }
            let after = shards
                .cross_slot_versions(&homes)
                .await
                .map_err(EngineError::from)?;
            if !in_flight && before == after {
                return Ok(Some((items, streamed)));
            }
        }
        Ok(None)
    }

    /// Replays into each side what SQL holds beyond what it read, up to the `seq` settled
    /// now: every entry up to it is committed, or never will be (appends run several at a
    /// time, and may commit out of `seq` order).
    async fn replay_settled(
        &self,
        own: &mut Side,
        wide: Option<&mut Side>,
        learn: &Learn<'_>,
    ) -> Result<(), VerifyError> {
        let settled = self.ledger.settled_seq().await.map_err(EngineError::from)?;
        let until = Some(settled.unwrap_or(0));
        self.replay_pages(&mut own.replayer, own.target.as_ref(), until, learn)
            .await?;
        if let Some(wide) = wide {
            self.replay_pages(&mut wide.replayer, wide.target.as_ref(), until, &wide_wants)
                .await?;
        }
        Ok(())
    }

    /// The counters of `group`'s shards the ledger knows of.
    fn known_in(&self, known: &KnownByKey, group: &[u16]) -> Vec<String> {
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
        // Consumes recorded in the totals: a moving hash whose rows are in SQL already (a
        // move not ended) is found through its rows' ids, which its content names; a
        // waiting one never is.
        for hash in &cut.totals {
            let mut content = None;
            let mut waiting = Vec::new();
            for (field, value) in hash {
                match field.as_str() {
                    "#" => content = crate::domain::EntryId::parse(value).ok(),
                    _ => match codec::decode_entries(value) {
                        Ok(decoded) => waiting.extend(decoded),
                        Err(error) => {
                            tracing::warn!(field, error = %error, "a consume in totals does not decode");
                        }
                    },
                }
            }
            match content {
                Some(content) => {
                    entries.extend(crate::engine::pipeline::fold::fold_moved(waiting, content))
                }
                None => entries.extend(waiting),
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
