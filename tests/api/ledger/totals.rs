//! The ledger's totals (`ledger_totals`) in SQL: what entries add to them, each entry once
//! however often it is appended, summed within one append, and what a void takes back; on
//! SQLite and Postgres.

use super::{entry, ledger_on};
use crate::helpers::{start_instant, PolicyBackend};
use crate::on_policy_stores;
use chrono::{DateTime, Duration, Utc};
use quota_ledger::domain::{EntryKind, LedgerEntry, PolicyId, TotalLine};

/// A row of `ledger_totals`: policy, budget, period end, amount, allowed, denied.
pub(super) type Row = (String, String, DateTime<Utc>, i64, i64, i64);

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
        folded: Vec::new(),
        totals,
        ..entry(id, subject, seconds)
    }
}

/// Every row of `ledger_totals` at `url`, in key order.
pub(super) async fn totals(url: &str) -> Vec<Row> {
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
        folded: Vec::new(),
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
        folded: Vec::new(),
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

/// Rows answered as JSON objects, as (policy, amount as written, allowed, denied).
fn policy_rows(rows: &[serde_json::Value]) -> Vec<(String, String, i64, i64)> {
    rows.iter()
        .map(|r| {
            (
                r["policy_id"].as_str().unwrap().to_owned(),
                r["amount"].to_string(),
                r["allowed"].as_i64().unwrap(),
                r["denied"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The ```sql blocks of docs/ledger-sql.md's "Totals" section, in order.
fn totals_queries() -> Vec<String> {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ledger-sql.md"))
        .unwrap();
    let start = docs.find("\n## Totals\n").expect("a Totals section");
    let section = &docs[start + 1..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| block[..block.find("```").expect("a closed block")].to_owned())
        .collect()
}

#[tokio::test]
async fn the_totals_queries_of_the_docs_answer_what_the_totals_hold() {
    let (ledger, settings) = ledger_on(PolicyBackend::Postgres).await;
    let day: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
    let next = day + Duration::days(1);
    let denied = |id: &str, budget: &str, denials: i64| LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Deny,
        counters: Vec::new(),
        totals: vec![TotalLine {
            denied: denials,
            ..line("sms-daily", budget, day, 0, 0)
        }],
        ..entry(id, budget, 9)
    };
    ledger
        .append(&[
            totalled(
                "q1",
                "user-42",
                0,
                vec![line("sms-daily", "user-42", day, 3, 3)],
            ),
            totalled(
                "q2",
                "user-42",
                1,
                vec![line("api-daily", "user-42", day, 7, 7)],
            ),
            totalled(
                "q3",
                "user-7",
                2,
                vec![line("sms-daily", "user-7", day, 2, 2)],
            ),
            totalled(
                "q4",
                "user-7",
                3,
                vec![line("sms-daily", "user-7", next, 1, 1)],
            ),
            denied("q5", "user-7", 2),
            denied("q6", "user-42", 1),
        ])
        .await
        .unwrap();
    let queries = totals_queries();
    assert_eq!(queries.len(), 3, "{queries:?}");
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let rows = |sql: String| {
        let pool = pool.clone();
        async move {
            let wrapped = format!(
                "SELECT CAST(to_jsonb(q) AS TEXT) FROM ({}) AS q",
                sql.trim().trim_end_matches(';')
            );
            let rows: Vec<String> = sqlx::query_scalar(&wrapped)
                .fetch_all(&pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            rows.into_iter()
                .map(|r| serde_json::from_str::<serde_json::Value>(&r).unwrap())
                .collect::<Vec<_>>()
        }
    };
    let seen = policy_rows(&rows(queries[0].clone()).await);
    assert_eq!(
        seen,
        [
            ("api-daily".into(), "7".into(), 7, 0),
            ("sms-daily".into(), "3".into(), 3, 1)
        ]
    );
    let seen = policy_rows(&rows(queries[1].clone()).await);
    assert_eq!(
        seen,
        [
            ("api-daily".into(), "7".into(), 7, 0),
            ("sms-daily".into(), "5".into(), 5, 3),
            ("sms-daily".into(), "1".into(), 1, 0)
        ]
    );
    let denied_most = rows(queries[2].clone()).await;
    let seen: Vec<(&str, i64)> = denied_most
        .iter()
        .map(|r| (r["budget"].as_str().unwrap(), r["denied"].as_i64().unwrap()))
        .collect();
    assert_eq!(seen, [("user-7", 2), ("user-42", 1)]);
}
