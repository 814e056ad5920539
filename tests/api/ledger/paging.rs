//! Paging the ledger store: cursors, and walking every page while entries keep arriving.

use super::{entry, ids, label, ledger_on};
use crate::helpers::{eventually, PolicyBackend};
use crate::on_policy_stores;
use quota_ledger::engine::ledger::{LedgerError, LedgerFilter};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

async fn a_full_last_page_has_no_cursor_and_a_foreign_cursor_is_refused(backend: PolicyBackend) {
    let (store, _database) = ledger_on(backend).await;
    let entries: Vec<_> = (0..4)
        .map(|i| entry(&format!("e{i}"), "alice", i))
        .collect();
    store.append(&entries).await.unwrap();
    let first = store.page(&LedgerFilter::default(), 2, None).await.unwrap();
    assert_eq!(ids(&first.items), ["e3", "e2"]);
    let cursor = first.next_cursor.expect("an older page exists");
    let last = store
        .page(&LedgerFilter::default(), 2, Some(&cursor))
        .await
        .unwrap();
    assert_eq!(ids(&last.items), ["e1", "e0"]);
    assert_eq!(last.next_cursor, None, "nothing is older");
    for bad in ["", "garbage", "1", &cursor[1..], &format!("{cursor}z")] {
        let refused = store.page(&LedgerFilter::default(), 2, Some(bad)).await;
        assert!(matches!(refused, Err(LedgerError::BadCursor)), "{bad:?}");
    }
}

async fn walking_the_pages_sees_every_entry_once_while_new_ones_keep_arriving(
    backend: PolicyBackend,
) {
    let (store, _database) = ledger_on(backend).await;
    let subject = |i: usize| if i.is_multiple_of(3) { "bob" } else { "alice" };
    // 600 entries in one append: more than one INSERT statement's worth.
    let seeded: Vec<_> = (0..600)
        .map(|i| entry(&format!("old-{i:04}"), subject(i), i as i64))
        .collect();
    assert_eq!(store.append(&seeded).await.unwrap(), 600);
    let inserted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = tokio::spawn({
        let (store, inserted, stop) = (store.clone(), inserted.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let n = inserted.load(Ordering::SeqCst);
                // New entries carry *older* timestamps: order is by insertion, not time.
                let new = entry(&format!("new-{n}"), subject(n), -(n as i64));
                store.append(&[new]).await.unwrap();
                inserted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    for filter in [
        LedgerFilter::default(),
        LedgerFilter {
            subject: Some("alice".to_owned()),
            ..LedgerFilter::default()
        },
    ] {
        let mut seen: Vec<String> = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = store.page(&filter, 25, cursor.as_deref()).await.unwrap();
            seen.extend(page.items.iter().map(|e| label(&e.id)));
            pages += 1;
            // At least one new entry lands between any two pages.
            let before = inserted.load(Ordering::SeqCst);
            eventually(
                std::time::Duration::from_secs(10),
                "a new entry landing before the next page",
                || async { (inserted.load(Ordering::SeqCst) > before).then_some(()) },
            )
            .await;
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "no entry is seen twice");
        let old: Vec<&str> = seen
            .iter()
            .map(String::as_str)
            .filter(|id| id.starts_with("old-"))
            .collect();
        let expected: Vec<String> = seeded
            .iter()
            .rev()
            .filter(|e| {
                filter
                    .subject
                    .as_ref()
                    .is_none_or(|s| s == e.subject.as_str())
            })
            .map(|e| label(&e.id))
            .collect();
        assert_eq!(old, expected, "every old entry exactly once, newest first");
        let first_old = seen.iter().position(|id| id.starts_with("old-"));
        let last_new = seen.iter().rposition(|id| id.starts_with("new-"));
        assert!(
            last_new < first_old,
            "entries inserted meanwhile only ever show before the older ones"
        );
        assert!(pages > 10, "{pages} pages");
    }
    stop.store(true, Ordering::SeqCst);
    inserter.await.unwrap();
    assert!(
        inserted.load(Ordering::SeqCst) > 20,
        "entries kept arriving during the walk"
    );
}

on_policy_stores!(
    a_full_last_page_has_no_cursor_and_a_foreign_cursor_is_refused,
    walking_the_pages_sees_every_entry_once_while_new_ones_keep_arriving,
);
