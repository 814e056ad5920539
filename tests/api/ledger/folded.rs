//! Folded rows in SQL (`folded`): the consumes of one commit recorded in the totals, as
//! one row, on SQLite and Postgres.

use super::{entry, ledger_on};
use crate::helpers::{start_instant, PolicyBackend};
use crate::on_policy_stores;
use chrono::Duration;
use quota_ledger::domain::{EntryKind, LedgerEntry, PolicyId, TotalLine};

fn line(
    policy: &str,
    budget: &str,
    end: chrono::DateTime<chrono::Utc>,
    amount: i64,
    allowed: i64,
) -> TotalLine {
    TotalLine {
        policy_id: PolicyId::parse("policy", policy).unwrap(),
        budget: budget.to_owned(),
        period_end: end,
        amount,
        allowed,
        denied: 0,
    }
}

/// A folded row (the consumes of one commit recorded in the totals, `folded`) is read back
/// whole, adds its totals like the rows it folds, and counts as `folded` charges or
/// denials in the hourly activity.
async fn folded_rows_read_back_whole_and_count_what_they_fold(backend: PolicyBackend) {
    let (ledger, settings) = ledger_on(backend).await;
    let url = settings.database_url.clone();
    let day = start_instant() + Duration::days(1);
    let charges = LedgerEntry {
        folded: ["a1", "a2", "a3"].map(super::entry_id).to_vec(),
        consumption_id: None,
        amount: 1_500,
        totals: vec![
            line("daily", "alice", day, 1_000, 2),
            line("daily", "bob", day, 500, 1),
        ],
        ..entry("f1", "*", 0)
    };
    let denials = LedgerEntry {
        folded: ["d1", "d2"].map(super::entry_id).to_vec(),
        kind: EntryKind::Deny,
        consumption_id: None,
        counters: Vec::new(),
        totals: vec![TotalLine {
            denied: 2,
            ..line("daily", "alice", day, 0, 0)
        }],
        ..entry("f2", "*", 1)
    };
    assert_eq!(
        ledger
            .append(&[charges.clone(), denials.clone()])
            .await
            .unwrap(),
        2
    );
    let read = ledger.entries_after(0, 10, None).await.unwrap();
    let read: Vec<LedgerEntry> = read.into_iter().map(|(_, e)| e).collect();
    assert_eq!(read, [charges, denials]);
    assert_eq!(
        super::totals::totals(&url).await,
        [
            ("daily".into(), "alice".into(), day, 1_000, 2, 2),
            ("daily".into(), "bob".into(), day, 500, 1, 0),
        ]
    );
    let hours = ledger
        .activity(start_instant(), start_instant() + Duration::hours(1), None)
        .await
        .unwrap();
    let counted: Vec<(u64, u64, u64)> = hours
        .iter()
        .map(|h| (h.charges, h.amount, h.denials))
        .collect();
    assert_eq!(counted, [(3, 1_500, 2)]);
    let denied = ledger
        .top_denied(
            start_instant(),
            start_instant() + Duration::hours(1),
            None,
            10,
        )
        .await
        .unwrap();
    assert!(
        denied.is_empty(),
        "a folded row names no subject: {denied:?}"
    );
}

on_policy_stores!(folded_rows_read_back_whole_and_count_what_they_fold);
