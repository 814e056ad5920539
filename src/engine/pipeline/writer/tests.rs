//! The writer against an in-memory store that records every `append` call.

use super::*;
use crate::domain::{Action, ConsumptionId, EntryId, EntryKind, HoldId, Subject};
use crate::engine::ledger::{DeniedSubject, HourActivity, LedgerFilter, LedgerPage};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Semaphore;

/// How the fake store answers `append`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Stores the entries (ignoring ids already present).
    Store,
    /// Refuses a batch holding an entry labelled `bad…` (a broken constraint).
    RefuseBad,
    /// The database is down.
    Down,
}

struct FakeStore {
    mode: Mode,
    /// Each `append` first takes a permit: none until a test opens the gate.
    gate: Semaphore,
    /// Each stored entry's id and label (its subject).
    ids: Mutex<Vec<(EntryId, String)>>,
    batches: Mutex<Vec<usize>>,
}

impl FakeStore {
    fn new(mode: Mode, open: bool) -> Arc<Self> {
        Arc::new(Self {
            mode,
            gate: Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }),
            ids: Mutex::new(Vec::new()),
            batches: Mutex::new(Vec::new()),
        })
    }

    fn open(&self) {
        self.gate.add_permits(Semaphore::MAX_PERMITS);
    }

    /// The labels of the stored entries, in the order stored.
    fn ids(&self) -> Vec<String> {
        let ids = self.ids.lock().expect("not poisoned");
        ids.iter().map(|(_, label)| label.clone()).collect()
    }

    fn batches(&self) -> Vec<usize> {
        self.batches.lock().expect("not poisoned").clone()
    }
}

#[async_trait]
impl LedgerStore for FakeStore {
    async fn add_events(
        &self,
        _events: &[crate::engine::alerts::AlertEvent],
    ) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn settled_seq(&self) -> Result<Option<i64>, LedgerError> {
        Ok(None)
    }

    async fn record_generations(
        &self,
        _prefix: &str,
        _generations: &[(u16, u64)],
    ) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn generations(&self, _prefix: &str) -> Result<Vec<(u16, u64)>, LedgerError> {
        Ok(Vec::new())
    }

    async fn seqs_of(
        &self,
        _ids: &[String],
    ) -> Result<std::collections::HashMap<String, i64>, LedgerError> {
        Ok(std::collections::HashMap::new())
    }

    async fn append(&self, entries: &[LedgerEntry]) -> Result<u64, LedgerError> {
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        // Long enough for other callers to queue behind this batch.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.batches
            .lock()
            .expect("not poisoned")
            .push(entries.len());
        match self.mode {
            Mode::Down => {
                return Err(LedgerError::unavailable(std::io::Error::other(
                    "pool timed out",
                )))
            }
            Mode::RefuseBad
                if entries
                    .iter()
                    .any(|e| e.subject.as_str().starts_with("bad")) =>
            {
                return Err(LedgerError::Corrupt("amount out of range".to_owned()))
            }
            _ => {}
        }
        let mut ids = self.ids.lock().expect("not poisoned");
        let mut new = 0;
        for entry in entries {
            if !ids.iter().any(|(id, _)| *id == entry.id) {
                ids.push((entry.id, entry.subject.to_string()));
                new += 1;
            }
        }
        Ok(new)
    }

    async fn page(
        &self,
        _: &LedgerFilter,
        _: u32,
        _: Option<&str>,
    ) -> Result<LedgerPage, LedgerError> {
        Ok(LedgerPage {
            items: Vec::new(),
            next_cursor: None,
        })
    }

    async fn charge_of(&self, _: ConsumptionId) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(None)
    }

    async fn hold_of(&self, _: HoldId) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(None)
    }

    async fn refunded(&self, _: ConsumptionId) -> Result<u64, LedgerError> {
        Ok(0)
    }

    async fn refunded_before(&self, _: ConsumptionId, _: i64) -> Result<u64, LedgerError> {
        Ok(0)
    }

    async fn first_seq_since(&self, _: DateTime<Utc>) -> Result<Option<i64>, LedgerError> {
        Ok(None)
    }

    async fn folded_in(
        &self,
        _: crate::domain::EntryId,
        _: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        Ok(false)
    }

    async fn entries_after(
        &self,
        _: i64,
        _: u32,
        _: Option<&crate::domain::Action>,
    ) -> Result<Vec<(i64, LedgerEntry)>, LedgerError> {
        Ok(Vec::new())
    }

    async fn activity(
        &self,
        _: DateTime<Utc>,
        _: DateTime<Utc>,
        _: Option<&str>,
    ) -> Result<Vec<HourActivity>, LedgerError> {
        Ok(Vec::new())
    }

    async fn top_denied(
        &self,
        _: DateTime<Utc>,
        _: DateTime<Utc>,
        _: Option<&str>,
        _: u32,
    ) -> Result<Vec<DeniedSubject>, LedgerError> {
        Ok(Vec::new())
    }

    async fn delete_older_than(&self, _: DateTime<Utc>, _: u32) -> Result<u64, LedgerError> {
        Ok(0)
    }
}

/// A charge whose subject is `label`, so that tests can tell entries apart.
fn entry(label: &str) -> LedgerEntry {
    LedgerEntry {
        folded: Vec::new(),
        id: EntryId::new(),
        at: DateTime::<Utc>::UNIX_EPOCH,
        kind: EntryKind::Charge,
        action: Action::parse("action", "sms.send").expect("a valid action"),
        subject: Subject::parse("subject", label).expect("a valid subject"),
        amount: 1,
        consumption_id: Some(ConsumptionId::new()),
        hold_id: None,
        idempotency_key: None,
        policies: Vec::new(),
        attributes: Default::default(),
        counters: Vec::new(),
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
    }
}

/// Appends `count` one-entry requests from as many tasks; returns their outcomes.
async fn append_from_tasks(writer: &LedgerWriter, count: usize) -> Vec<Result<(), LedgerError>> {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.append(vec![entry(&format!("e{i}"))]).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("the task ran"));
    }
    outcomes
}

/// Waits until the store holds `count` entries (the writer works in the background).
async fn until_stored(store: &FakeStore, count: usize) {
    for _ in 0..500 {
        if store.ids().len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store holds {} entries, not {count}", store.ids().len());
}

#[tokio::test]
async fn concurrent_appends_are_all_committed_exactly_once_in_a_few_batches() {
    let store = FakeStore::new(Mode::Store, true);
    let writer = LedgerWriter::spawn(store.clone());
    let outcomes = append_from_tasks(&writer, 300).await;
    assert!(outcomes.iter().all(Result::is_ok));
    let ids = store.ids();
    assert_eq!(ids.len(), 300);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        300,
        "no duplicates"
    );
    let batches = store.batches();
    assert_eq!(
        batches.iter().sum::<usize>(),
        300,
        "each entry written once"
    );
    assert!(batches.len() <= 5, "requests share commits: {batches:?}");
}

#[tokio::test]
async fn a_batch_holds_at_most_a_thousand_entries() {
    let store = FakeStore::new(Mode::Store, false);
    let writer = LedgerWriter::spawn(store.clone());
    let appends = tokio::spawn({
        let writer = writer.clone();
        async move { append_from_tasks(&writer, 2_500).await }
    });
    // Let every request queue up behind the first, gated batch.
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.open();
    let outcomes = appends.await.expect("the task ran");
    assert!(outcomes.iter().all(Result::is_ok));
    let batches = store.batches();
    assert_eq!(batches.iter().sum::<usize>(), 2_500);
    assert!(batches.iter().all(|&n| n <= MAX_BATCH), "{batches:?}");
    assert!(batches.len() <= 5, "{batches:?}");
}

#[tokio::test]
async fn a_failed_batch_fails_every_caller_of_it() {
    let store = FakeStore::new(Mode::Down, true);
    let writer = LedgerWriter::spawn(store.clone());
    let outcomes = append_from_tasks(&writer, 50).await;
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Err(LedgerError::Unavailable(_)))));
}

#[tokio::test]
async fn a_refused_request_does_not_fail_the_others_of_its_batch() {
    let store = FakeStore::new(Mode::RefuseBad, false);
    let writer = LedgerWriter::spawn(store.clone());
    let tasks: Vec<_> = ["ok-1", "bad-1", "ok-2"]
        .into_iter()
        .map(|id| {
            let writer = writer.clone();
            tokio::spawn(async move { (id, writer.append(vec![entry(id)]).await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.open();
    for task in tasks {
        let (id, outcome) = task.await.expect("the task ran");
        match id.starts_with("bad") {
            true => assert!(matches!(outcome, Err(LedgerError::Corrupt(_))), "{id}"),
            false => assert!(outcome.is_ok(), "{id}: {outcome:?}"),
        }
    }
    let mut ids = store.ids();
    ids.sort();
    assert_eq!(ids, ["ok-1", "ok-2"]);
}

#[tokio::test]
async fn entries_queued_when_the_last_handle_goes_are_still_written() {
    let store = FakeStore::new(Mode::Store, false);
    let writer = LedgerWriter::spawn(store.clone());
    // Queue a request, then stop waiting for it (as a cancelled HTTP request would).
    let waiting = tokio::time::timeout(Duration::ZERO, writer.append(vec![entry("kept")])).await;
    assert!(waiting.is_err(), "still queued behind the closed gate");
    drop(writer);
    store.open();
    until_stored(&store, 1).await;
    assert_eq!(store.ids(), ["kept"]);
}

#[tokio::test]
async fn a_flush_resolves_once_everything_queued_before_it_is_committed() {
    let store = FakeStore::new(Mode::Store, false);
    let writer = LedgerWriter::spawn(store.clone());
    let queued = tokio::spawn({
        let writer = writer.clone();
        async move { append_from_tasks(&writer, 50).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let flush = tokio::spawn({
        let writer = writer.clone();
        async move { writer.flush().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!flush.is_finished(), "the store has committed nothing yet");
    store.open();
    flush.await.expect("the task ran").expect("flushed");
    assert_eq!(
        store.ids().len(),
        50,
        "all committed when the flush resolved"
    );
    assert!(queued
        .await
        .expect("the task ran")
        .iter()
        .all(Result::is_ok));
}
