//! The ledger's totals (`ledger_totals`) in SQL: what entries add to them, each entry once
//! however often it is appended, summed within one append, and what a void takes back; on
//! SQLite and Postgres.

use super::{entry, ledger_on};
use crate::helpers::{start_instant, PolicyBackend};
use crate::on_policy_stores;
use chrono::{DateTime, Duration, Utc};
use quota_ledger::domain::{EntryKind, LedgerEntry, PolicyId, TotalLine};

/// A row of `ledger_totals`: policy, budget, period end, amount, allowed, denied.
type Row = (String, String, DateTime<Utc>, i64, i64, i64);

fn line(policy: &str, budget: &str, end: DateTime<Utc>, amount: i64, allowed: i64) -> TotalLine {
    TotalLine {
        policy_id: PolicyId::parse("policy", policy).unwrap(),
        budget: budget.to_owned(),
        period_end: end,
        amount,
        allowed,
        denied: 0,
    }
}

/// `entry` `id` of `subject`, adding `totals`.
fn totalled(id: &str, subject: &str, seconds: i64, totals: Vec<TotalLine>) -> LedgerEntry {
    LedgerEntry {
        totals,
        ..entry(id, subject, seconds)
    }
}

/// Every row of `ledger_totals` at `url`, in key order.
async fn totals(url: &str) -> Vec<Row> {
    let sql = "SELECT policy_id, budget, period_end, CAST(amount AS BIGINT), allowed, denied \
               FROM ledger_totals ORDER BY policy_id, budget, period_end";
    match url.starts_with("postgres") {
        true => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query_as(sql).fetch_all(&pool).await.unwrap()
        }
        false => {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query_as(sql).fetch_all(&pool).await.unwrap()
        }
    }
}

async fn entries_add_their_totals_once_and_a_void_takes_them_back(backend: PolicyBackend) {
    let (ledger, settings) = ledger_on(backend).await;
    let url = settings.database_url.clone();
    let day = start_instant() + Duration::days(1);
    let hour = start_instant() + Duration::hours(1);
    let row = |policy: &str, budget: &str, end, amount, allowed, denied| -> Row {
        (policy.into(), budget.into(), end, amount, allowed, denied)
    };

    let alice = totalled("t1", "alice", 0, vec![line("daily", "alice", day, 500, 1)]);
    let bob = totalled(
        "t2",
        "bob",
        1,
        vec![
            line("daily", "bob", day, 300, 1),
            line("hourly", "bob", hour, 300, 1),
        ],
    );
    let denied = LedgerEntry {
        kind: EntryKind::Deny,
        counters: Vec::new(),
        totals: vec![TotalLine {
            denied: 1,
            ..line("daily", "alice", day, 0, 0)
        }],
        ..entry("t3", "alice", 2)
    };
    let plain = entry("t4", "carol", 3);
    let batch = [alice.clone(), bob.clone(), denied, plain];
    assert_eq!(ledger.append(&batch).await.unwrap(), 4);
    let expected = vec![
        row("daily", "alice", day, 500, 1, 1),
        row("daily", "bob", day, 300, 1, 0),
        row("hourly", "bob", hour, 300, 1, 0),
    ];
    assert_eq!(
        totals(&url).await,
        expected,
        "an entry without totals adds none"
    );

    // Appended again (a drain's retry): nothing is added twice.
    assert_eq!(ledger.append(&batch).await.unwrap(), 0);
    assert_eq!(
        ledger.append(&[bob.clone(), alice.clone()]).await.unwrap(),
        0
    );
    assert_eq!(totals(&url).await, expected);

    // Two entries of one append adding to the same row: both count.
    let more = [
        totalled("t5", "alice", 4, vec![line("daily", "alice", day, 200, 1)]),
        totalled("t6", "alice", 5, vec![line("daily", "alice", day, 100, 1)]),
    ];
    assert_eq!(ledger.append(&more).await.unwrap(), 2);
    // A void of bob's charge adds the negative of its lines.
    let void = LedgerEntry {
        kind: EntryKind::Void,
        counters: Vec::new(),
        totals: bob.totals.iter().map(TotalLine::voided).collect(),
        ..entry("t7", "bob", 6)
    };
    assert_eq!(ledger.append(&[void]).await.unwrap(), 1);
    assert_eq!(
        totals(&url).await,
        [
            row("daily", "alice", day, 800, 3, 1),
            row("daily", "bob", day, 0, 0, 0),
            row("hourly", "bob", hour, 0, 0, 0),
        ]
    );
}

on_policy_stores!(entries_add_their_totals_once_and_a_void_takes_them_back);
