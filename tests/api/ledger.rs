//! The SQL ledger stores, their writer and retention, against real SQLite and Postgres.

mod activity;
mod background;
mod drain;
mod folded;
mod http;
mod paging;
mod partitions;
mod settled;
mod sql;
mod totals;

use crate::helpers::{fresh_settings, start_instant, CounterBackend, FreshSettings, PolicyBackend};
use crate::on_policy_stores;
use chrono::Duration;
use quota_ledger::domain::{
    Action, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, IdempotencyKey, LedgerEntry,
    PolicyAmount, PolicyId, Restore, Subject,
};
use quota_ledger::engine::ledger::{LedgerError, LedgerFilter, LedgerStore};
use std::sync::Arc;

/// A fresh, migrated database of `backend` and a ledger store on it, with the settings that
/// own the database: keep them while the store is in use (on SQLite they delete it).
pub async fn ledger_on(backend: PolicyBackend) -> (Arc<dyn LedgerStore>, FreshSettings) {
    let settings = fresh_settings(backend, CounterBackend::Memory).await;
    (ledger_at(&settings.database_url).await, settings)
}

/// A ledger store on the fresh database at `url`, migrated; on Postgres, partitioned by
/// day as a service partitions it, from the week before the start instant (the old table
/// ends on the start's day, each day after it has its partition).
pub async fn ledger_at(url: &str) -> Arc<dyn LedgerStore> {
    quota_ledger::db::migrate_url(url).await.unwrap();
    quota_ledger::ledger::partitions::look_url(url, start_instant() - Duration::days(7))
        .await
        .unwrap();
    quota_ledger::ledger::sql::connect(url).await.unwrap()
}

/// The UUID whose bytes are `label`'s (at most 16 ASCII bytes), so that tests can name
/// ids with short labels and read them back ([`label`]).
fn label_uuid(label: &str) -> String {
    assert!(
        label.is_ascii() && label.len() <= 16,
        "label {label:?} too long"
    );
    let mut bytes = [0u8; 16];
    bytes[..label.len()].copy_from_slice(label.as_bytes());
    uuid::Uuid::from_bytes(bytes).to_string()
}

/// The entry id labelled `label`.
pub fn entry_id(label: &str) -> EntryId {
    EntryId::parse(&label_uuid(label)).unwrap()
}

/// The consumption id labelled `label`.
pub fn consumption_id(label: &str) -> ConsumptionId {
    ConsumptionId::parse(&label_uuid(label)).unwrap()
}

/// The hold id (in shard 1) labelled `label`.
pub fn hold_id(label: &str) -> HoldId {
    HoldId::parse(&format!("{}.1", label_uuid(label))).unwrap()
}

/// The label of an id made by [`entry_id`].
pub fn label(id: &EntryId) -> String {
    let uuid = uuid::Uuid::parse_str(&id.to_string()).unwrap();
    uuid.as_bytes()
        .iter()
        .filter(|b| **b != 0)
        .map(|b| char::from(*b))
        .collect()
}

/// A charge of 500 by `subject` on `transfer`, `seconds` after the start instant.
pub fn entry(id: &str, subject: &str, seconds: i64) -> LedgerEntry {
    let policy_id = PolicyId::parse("policy_id", "transfer-daily").unwrap();
    LedgerEntry {
        folded: Vec::new(),
        id: entry_id(id),
        at: start_instant() + Duration::seconds(seconds),
        kind: EntryKind::Charge,
        action: Action::parse("action", "transfer").unwrap(),
        subject: Subject::parse("subject", subject).unwrap(),
        amount: 500,
        consumption_id: Some(consumption_id(&format!("c-{id}"))),
        hold_id: None,
        idempotency_key: None,
        policies: vec![PolicyAmount {
            policy_id: policy_id.clone(),
            amount: 500,
            scope: Default::default(),
        }],
        attributes: Default::default(),
        counters: vec![CounterCharge {
            policy_id,
            key: "k1".to_owned(),
            restore: Restore::Rolling {
                bucket: 7,
                bucket_ms: 3_600_000,
                buckets: 24,
            },
            by_amount: true,
            charged: 500,
            scope: Default::default(),
        }],
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
    }
}

/// Every entry matching `filter`, newest first, following the cursors.
pub async fn everything(store: &dyn LedgerStore, filter: &LedgerFilter) -> Vec<LedgerEntry> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.page(filter, 1000, cursor.as_deref()).await.unwrap();
        all.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
}

/// The labels of `entries`' ids.
pub fn ids(entries: &[LedgerEntry]) -> Vec<String> {
    entries.iter().map(|e| label(&e.id)).collect()
}

async fn appending_an_entry_twice_stores_it_once(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let mut a = entry("a", "alice", 0);
    a.at += Duration::milliseconds(123);
    a.idempotency_key = Some(IdempotencyKey::parse("key-1").unwrap());
    let b = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Hold,
        hold_id: Some(hold_id("h-1")),
        consumption_id: None,
        counters: Vec::new(),
        policies: Vec::new(),
        ..entry("b", "bob", 1)
    };
    let c = entry("c", "carol", 2);
    assert_eq!(store.append(&[a.clone(), b.clone()]).await.unwrap(), 2);
    assert_eq!(store.append(&[b.clone(), c.clone()]).await.unwrap(), 1);
    assert_eq!(store.append(std::slice::from_ref(&c)).await.unwrap(), 0);
    assert_eq!(store.append(&[]).await.unwrap(), 0);
    let d = entry("d", "dave", 3);
    assert_eq!(store.append(&[d.clone(), d.clone()]).await.unwrap(), 1);
    // Every field comes back as written, newest first.
    assert_eq!(
        everything(store.as_ref(), &LedgerFilter::default()).await,
        [d, c, b, a]
    );
}

async fn an_entry_breaking_a_constraint_fails_its_whole_batch(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let too_much = LedgerEntry {
        folded: Vec::new(),
        amount: 1 << 53,
        ..entry("too-much", "alice", 0)
    };
    let fine = entry("fine", "alice", 1);
    let refused = store.append(&[fine.clone(), too_much]).await;
    assert!(
        matches!(refused, Err(LedgerError::Corrupt(_))),
        "{refused:?}"
    );
    assert!(everything(store.as_ref(), &LedgerFilter::default())
        .await
        .is_empty());
    assert_eq!(store.append(&[fine]).await.unwrap(), 1);
}

async fn pages_filter_by_subject_action_kind_and_time(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let refund = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Refund,
        consumption_id: Some(consumption_id("c-1")),
        ..entry("2", "alice", 60)
    };
    let sms = LedgerEntry {
        folded: Vec::new(),
        action: Action::parse("action", "sms.send").unwrap(),
        ..entry("3", "bob", 120)
    };
    let entries = [entry("1", "alice", 0), refund, sms, entry("4", "bob", 180)];
    store.append(&entries).await.unwrap();
    let at = |seconds| Some(start_instant() + Duration::seconds(seconds));
    let all = LedgerFilter::default;
    for (filter, expected) in [
        (all(), vec!["4", "3", "2", "1"]),
        (
            LedgerFilter {
                subject: Some("alice".into()),
                ..all()
            },
            vec!["2", "1"],
        ),
        (
            LedgerFilter {
                subject: Some("nobody".into()),
                ..all()
            },
            vec![],
        ),
        (
            LedgerFilter {
                action: Some("transfer".into()),
                ..all()
            },
            vec!["4", "2", "1"],
        ),
        (
            LedgerFilter {
                kind: Some(EntryKind::Refund),
                ..all()
            },
            vec!["2"],
        ),
        (
            LedgerFilter {
                kind: Some(EntryKind::Charge),
                subject: Some("bob".into()),
                ..all()
            },
            vec!["4", "3"],
        ),
        (
            LedgerFilter {
                from: at(60),
                ..all()
            },
            vec!["4", "3", "2"],
        ),
        (
            LedgerFilter {
                to: at(120),
                ..all()
            },
            vec!["2", "1"],
        ),
        (
            LedgerFilter {
                from: at(59),
                to: at(121),
                ..all()
            },
            vec!["3", "2"],
        ),
        (
            LedgerFilter {
                from: at(1),
                to: at(60),
                ..all()
            },
            vec![],
        ),
    ] {
        let page = store.page(&filter, 10, None).await.unwrap();
        assert_eq!(ids(&page.items), expected, "{filter:?}");
        assert_eq!(page.next_cursor, None, "{filter:?}");
    }
}

async fn charges_holds_and_refund_totals_are_found_by_their_ids(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let charge = LedgerEntry {
        folded: Vec::new(),
        consumption_id: Some(consumption_id("c-1")),
        amount: 1000,
        ..entry("charge", "alice", 0)
    };
    let refund = |id: &str, amount| LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Refund,
        consumption_id: Some(consumption_id("c-1")),
        amount,
        ..entry(id, "alice", 1)
    };
    let hold = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Hold,
        consumption_id: None,
        hold_id: Some(hold_id("h-1")),
        ..entry("hold", "bob", 2)
    };
    let commit = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Commit,
        ..hold.clone()
    };
    let entries = [
        charge.clone(),
        refund("r1", 300),
        refund("r2", 200),
        hold.clone(),
        LedgerEntry {
            folded: Vec::new(),
            id: entry_id("commit"),
            ..commit
        },
    ];
    store.append(&entries).await.unwrap();
    assert_eq!(
        store.charge_of(consumption_id("c-1")).await.unwrap(),
        Some(charge)
    );
    assert_eq!(
        store.charge_of(consumption_id("c-unknown")).await.unwrap(),
        None
    );
    assert_eq!(store.hold_of(hold_id("h-1")).await.unwrap(), Some(hold));
    assert_eq!(store.hold_of(hold_id("c-1")).await.unwrap(), None);
    assert_eq!(store.refunded(consumption_id("c-1")).await.unwrap(), 500);
    assert_eq!(
        store.refunded(consumption_id("c-unknown")).await.unwrap(),
        0
    );
}

on_policy_stores!(
    appending_an_entry_twice_stores_it_once,
    an_entry_breaking_a_constraint_fails_its_whole_batch,
    pages_filter_by_subject_action_kind_and_time,
    charges_holds_and_refund_totals_are_found_by_their_ids,
);
