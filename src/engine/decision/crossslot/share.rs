//! The share of a give-back in other slots than its home (`engine::decision::crossslot`):
//! on a store that takes one slot per call, a refund, settlement or void gives back at home
//! first, with a pending record there, then once in each other slot (a marker per entry);
//! the sweeper redoes a share an instance did not finish, and a replay marks what it gave.

use super::{resolved, ATTEMPT_MS, MARKER_TTL_MS};
use crate::domain::{CounterCharge, LedgerEntry};
use crate::engine::alerts;
use crate::engine::codec::{self, IntentRecord};
use crate::engine::decision::giveback::alerts::with_usage;
use crate::engine::decision::Decider;
use crate::engine::state::ReplayOp;
use crate::engine::store::{GiveBack, GiveBackKind, GivenBack, IntentOpen, StoreError};
use crate::keys;
use std::collections::BTreeMap;

impl Decider {
    /// The once-markers of a give-back's share in other slots than its home, on a store that
    /// takes one slot per call, for a replay of `entry` (whose `ops` give its share back):
    /// a share the sweeper would redo after the rebuild must find it given.
    pub(in crate::engine) fn share_markers(
        &self,
        entry: &LedgerEntry,
        ops: &[ReplayOp],
    ) -> Vec<ReplayOp> {
        if !self.one_slot_per_call() {
            return Vec::new();
        }
        let home = keys::shard(entry.action.as_str(), entry.subject.as_str());
        let mut shards: Vec<u16> = ops
            .iter()
            .filter_map(|op| match op {
                ReplayOp::GiveBack { request, .. } => Some(&request.counters),
                _ => None,
            })
            .flatten()
            .filter_map(|c| keys::shard_of(&c.key))
            .filter(|shard| *shard != home)
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let id = entry.id.to_string();
        shards
            .into_iter()
            .map(|shard| ReplayOp::Record {
                key: keys::giveback_marker(&self.prefix, shard, &id),
                text: "1".to_owned(),
                expires_at_ms: entry.at.timestamp_millis() + MARKER_TTL_MS,
            })
            .collect()
    }

    /// A give-back's share in foreign shards, on a store that takes one slot per call: the
    /// counters of `request` outside `home` are taken out of it and returned by shard.
    pub(in crate::engine) fn foreign_share(
        &self,
        home: u16,
        request: &mut GiveBack,
    ) -> BTreeMap<u16, Vec<CounterCharge>> {
        let mut foreign: BTreeMap<u16, Vec<CounterCharge>> = BTreeMap::new();
        if !self.one_slot_per_call() {
            return foreign;
        }
        request
            .counters
            .retain(|counter| match keys::shard_of(&counter.key) {
                Some(shard) if shard != home => {
                    foreign.entry(shard).or_default().push(counter.clone());
                    false
                }
                _ => true,
            });
        foreign
    }

    /// Whether `counter` is given back with its charge's home shard: always, but on a store
    /// that takes one slot per call (a Redis Cluster) for a counter in another slot.
    pub(in crate::engine) fn at_home(&self, home: u16, counter: &CounterCharge) -> bool {
        !self.one_slot_per_call() || keys::shard_of(&counter.key).is_none_or(|s| s == home)
    }

    /// The record kept at home with a give-back whose share of other slots is given next
    /// (`GiveBack::pending`): the sweeper redoes the share if the instance dies first.
    pub(in crate::engine) fn pending_share(
        &self,
        home: u16,
        entry: &LedgerEntry,
        foreign: &BTreeMap<u16, Vec<CounterCharge>>,
        alerts: &[(u16, String)],
    ) -> Option<IntentOpen> {
        if foreign.is_empty() {
            return None;
        }
        let member = entry.id.to_string();
        let record = IntentRecord {
            home: Vec::new(),
            foreign: foreign
                .iter()
                .map(|(shard, counters)| (*shard, counters.clone()))
                .collect(),
            alerts: alerts.to_vec(),
        };
        Some(IntentOpen {
            key: keys::intent(&self.prefix, home, &member),
            index_key: keys::intents_index(&self.prefix, home),
            member,
            deadline_ms: self.now().timestamp_millis() + ATTEMPT_MS,
            record: codec::encode_intent(&record),
        })
    }

    /// Gives the entry `id`'s share back to foreign shards, once each (a marker per entry):
    /// count policies their charge when `full`, amount policies `by_amount` (below zero:
    /// charged that much more, an over-capture's excess); records the alert events the
    /// shards' usage reports tell (`alerts`: the entry keeping each alerting shard's
    /// policies); then drops its pending record at `home` from the index.
    pub(in crate::engine) async fn restore_foreign(
        &self,
        home: u16,
        id: &str,
        foreign: BTreeMap<u16, Vec<CounterCharge>>,
        (full, by_amount): (bool, i64),
        alerts: &[(u16, String)],
    ) -> Result<(), StoreError> {
        let now_ms = self.now().timestamp_millis();
        let mut events = Vec::new();
        let shards: Vec<u16> = foreign.keys().copied().collect();
        for (shard, counters) in foreign {
            let told = alerts.iter().find(|(s, _)| *s == shard).map(|(_, e)| e);
            let request = GiveBack {
                kind: GiveBackKind::RestoreOnce { full, by_amount },
                pending: None,
                reports_usage: told.is_some(),
                control_key: keys::giveback_marker(&self.prefix, shard, id),
                hold_index: None,
                counters,
                ledger: None,
                idempotency: None,
            };
            let given = self.counters.give_back(now_ms, &request).await?;
            if let (Some(told), GivenBack::Done { usage, .. }) = (told, given) {
                let entry = codec::decode_entry(told).map_err(StoreError::from)?;
                events.extend(alerts::events_of(&with_usage(entry, &usage)));
            }
        }
        // Recorded before the pending record goes: a crash first, and the sweeper gives
        // the share again, which the markers make a replay of the same reports.
        if !events.is_empty() {
            if crate::engine::faults::fault!(self, "crossslot.events") {
                return Err(StoreError::Unavailable(
                    "failpoint crossslot.events: the events were not recorded".to_owned(),
                ));
            }
            self.ledger.add_events(&events).await.map_err(|error| {
                StoreError::Unavailable(format!("recording alert events: {error}"))
            })?;
        }
        // The shards' floors cover the share before its pending record goes, so that a
        // node that comes back without it is caught (its entry is at home).
        self.pipeline.raise_floors_now(&shards).await?;
        let resolved = resolved(&self.prefix, home, id);
        self.counters.give_back(now_ms, &resolved).await?;
        Ok(())
    }
}
