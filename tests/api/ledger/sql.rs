//! The ledger read in SQL, without our code: the JSON columns, the example queries of
//! docs/ledger-sql.md run as written, and rows of the compact form rewritten forward.

use super::{entry, ledger_on};
use crate::helpers::{start_instant, PolicyBackend};
use crate::on_policy_stores;
use chrono::Duration;
use quota_ledger::domain::{Attributes, EntryKind, LedgerEntry, PolicyAmount, PolicyId, Scope};
use quota_ledger::engine::ledger::LedgerFilter;
use serde_json::{json, Value};

/// `entry` charged to `transfer-daily` (per subject) and `transfer-country` (per country)
/// from `country`, at `seconds` after the start, with `amount` for both policies.
fn transfer(
    id: &str,
    kind: EntryKind,
    subject: &str,
    country: &str,
    seconds: i64,
    amount: u64,
) -> LedgerEntry {
    let policy = |id: &str, scope: &[&str]| PolicyAmount {
        policy_id: PolicyId::parse("policy", id).unwrap(),
        amount,
        scope: Scope::parse("scope", scope).unwrap(),
    };
    let base = entry(id, subject, seconds);
    LedgerEntry {
        folded: Vec::new(),
        kind,
        amount,
        policies: vec![
            policy("transfer-daily", &["subject"]),
            policy("transfer-country", &["country"]),
        ],
        attributes: Attributes::parse("attributes", [("country".to_owned(), country.to_owned())])
            .unwrap(),
        counters: match kind {
            EntryKind::Deny => Vec::new(),
            _ => base.counters.clone(),
        },
        consumption_id: match kind {
            EntryKind::Deny => None,
            _ => base.consumption_id,
        },
        ..base
    }
}

/// A ledger of known entries: user-42 charged 500 and 300 on the first day, 200 of the
/// first refunded; three denials (two from NG, one from US); user-7 charged 100 the next
/// day.
fn known_ledger() -> Vec<LedgerEntry> {
    let refund = LedgerEntry {
        folded: Vec::new(),
        consumption_id: transfer("e1", EntryKind::Charge, "user-42", "NG", 0, 500).consumption_id,
        ..transfer("e3", EntryKind::Refund, "user-42", "NG", 120, 200)
    };
    vec![
        transfer("e1", EntryKind::Charge, "user-42", "NG", 0, 500),
        transfer("e2", EntryKind::Charge, "user-42", "NG", 60, 300),
        refund,
        transfer("e4", EntryKind::Deny, "user-7", "NG", 180, 900),
        transfer("e5", EntryKind::Deny, "user-8", "US", 240, 900),
        transfer("e6", EntryKind::Deny, "user-9", "NG", 300, 900),
        transfer("e7", EntryKind::Charge, "user-7", "US", 24 * 3600, 100),
    ]
}

/// The ```sql blocks of `text` after the heading `heading`, in order.
fn sql_blocks(text: &str, heading: &str) -> Vec<String> {
    let section = &text[text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"))..];
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| block[..block.find("```").expect("a closed block")].to_owned())
        .collect()
}

/// A query's rows, each as a JSON object of its columns (as text, or JSON for jsonb).
async fn rows_of(pool: &sqlx::PgPool, sql: &str) -> Vec<Value> {
    let wrapped = format!(
        "SELECT to_jsonb(q) FROM ({}) AS q",
        sql.trim().trim_end_matches(';')
    );
    let rows: Vec<(Value,)> = sqlx::query_as(&wrapped)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter().map(|(row,)| row).collect()
}

#[tokio::test]
async fn the_example_queries_of_the_docs_answer_what_the_ledger_holds() {
    let (ledger, settings) = ledger_on(PolicyBackend::Postgres).await;
    ledger.append(&known_ledger()).await.unwrap();
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ledger-sql.md"))
        .unwrap();
    let queries = sql_blocks(&docs, "## Example queries");
    assert_eq!(queries.len(), 5, "the docs' example queries: {queries:?}");

    let day = rows_of(&pool, &queries[0]).await;
    let kinds: Vec<&str> = day.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["charge", "charge", "refund"], "{day:?}");
    assert_eq!(day[0]["policies"][1]["budget"], json!({"country": "NG"}));

    let usage: Vec<(String, String, Value, i64)> = rows_of(&pool, &queries[1])
        .await
        .into_iter()
        .map(|r| {
            let day = r["day"].as_str().unwrap()[..10].to_owned();
            let used = r["used"].as_i64().unwrap();
            (
                day,
                r["policy"].as_str().unwrap().to_owned(),
                r["budget"].clone(),
                used,
            )
        })
        .collect();
    assert_eq!(
        usage,
        [
            (
                "2026-11-21".into(),
                "transfer-country".into(),
                json!({"country": "NG"}),
                600
            ),
            (
                "2026-11-21".into(),
                "transfer-daily".into(),
                json!({"subject": "user-42"}),
                600
            ),
            (
                "2026-11-22".into(),
                "transfer-country".into(),
                json!({"country": "US"}),
                100
            ),
            (
                "2026-11-22".into(),
                "transfer-daily".into(),
                json!({"subject": "user-7"}),
                100
            ),
        ]
    );

    let denials = rows_of(&pool, &queries[2]).await;
    assert_eq!(
        denials,
        [
            json!({"country": "NG", "denials": 2}),
            json!({"country": "US", "denials": 1})
        ]
    );
    let payments =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/payments.md")).unwrap();
    let in_payments = sql_blocks(&payments, "## The ledger in SQL");
    assert_eq!(
        rows_of(&pool, &in_payments[0]).await,
        denials,
        "docs/payments.md's query"
    );

    let reconciled = rows_of(&pool, &queries[3]).await;
    assert_eq!(reconciled, [json!({"subject": "user-42", "used": 600})]);

    let refunds = rows_of(&pool, &queries[4]).await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(
        (&refunds[0]["refunded"], &refunds[0]["charged"]),
        (&json!(200), &json!(500))
    );
}

/// The compact text the `policies` column held before it was JSON, for [`transfer`]'s
/// two policies at the entry's own amount: version `p1`, then per policy its id, an empty
/// amount (the entry's) and the scope's names when not the default.
const COMPACT_POLICIES: &str =
    "p1\u{1f}transfer-daily\u{1d}\u{1e}transfer-country\u{1d}\u{1d}country";

/// Runs `sql` with `bind` on the database at `url`, whichever it is.
async fn execute(url: &str, sql: &str, bind: &str) {
    match url.starts_with("postgres") {
        true => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query(sql).bind(bind).execute(&pool).await.unwrap();
        }
        false => {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query(sql).bind(bind).execute(&pool).await.unwrap();
        }
    }
}

/// The `policies` column of the only row, as JSON (`None` when NULL).
async fn policies_column(url: &str) -> Option<Value> {
    let sql = "SELECT CAST(policies AS TEXT) FROM ledger_entries";
    let text: Option<String> = match url.starts_with("postgres") {
        true => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap()
        }
        false => {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap()
        }
    };
    text.map(|text| serde_json::from_str(&text).unwrap())
}

async fn a_row_of_the_compact_form_reads_and_is_rewritten_as_json(backend: PolicyBackend) {
    let (ledger, settings) = ledger_on(backend).await;
    let url = settings.database_url.clone();
    let charge = transfer("e1", EntryKind::Charge, "user-42", "NG", 0, 500);
    ledger.append(std::slice::from_ref(&charge)).await.unwrap();
    let written = json!([
        {"policy": "transfer-daily", "amount": 500, "scope": ["subject"], "budget": {"subject": "user-42"}},
        {"policy": "transfer-country", "amount": 500, "scope": ["country"], "budget": {"country": "NG"}},
    ]);
    assert_eq!(policies_column(&url).await, Some(written.clone()));

    // As a row written before the schema change, after its migration.
    execute(
        &url,
        "UPDATE ledger_entries SET policies = NULL, policies_compact = $1",
        COMPACT_POLICIES,
    )
    .await;
    let read = super::everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(
        read,
        std::slice::from_ref(&charge),
        "the compact form still reads"
    );

    assert_eq!(
        quota_ledger::ledger::upgrade::upgrade_url(&url)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        policies_column(&url).await,
        Some(written),
        "rewritten as JSON"
    );
    let read = super::everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(read, [charge], "and reads the same");
    assert_eq!(
        quota_ledger::ledger::upgrade::upgrade_url(&url)
            .await
            .unwrap(),
        0,
        "once"
    );
}

on_policy_stores!(a_row_of_the_compact_form_reads_and_is_rewritten_as_json);

#[tokio::test]
async fn every_start_finds_the_rows_left_to_rewrite_through_an_index_not_the_ledger() {
    let (_ledger, settings) = ledger_on(PolicyBackend::Postgres).await;
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    let mut connection = pool.acquire().await.unwrap();
    // As on a large ledger, where reading every row is what the planner avoids.
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *connection)
        .await
        .unwrap();
    let explain = format!("EXPLAIN {}", quota_ledger::ledger::upgrade::COMPACT_ROWS);
    let plan: Vec<String> = sqlx::query_scalar(&explain)
        .bind(0_i64)
        .bind(1_000_i64)
        .fetch_all(&mut *connection)
        .await
        .unwrap();
    assert!(
        plan.iter()
            .any(|line| reads_index(line, "ledger_entries_compact_idx")),
        "{plan:#?}"
    );
}

#[test]
fn the_known_ledger_starts_on_the_docs_day() {
    // The docs' queries name 2026-11-21 and 2026-11-22: the test clock's first two days.
    assert_eq!(start_instant().date_naive().to_string(), "2026-11-21");
    assert_eq!(
        (start_instant() + Duration::days(1))
            .date_naive()
            .to_string(),
        "2026-11-22"
    );
}

/// On Postgres, with a ledger whose statistics look like a real one (50,000 entries over
/// 5,000 subjects and 20 actions, one in a hundred a refund) and sequential scans ruled
/// out: each filter of the query API, alone or with others, is read through its index
/// when what it asks for is rare. (What is common, the planner rightly finds by reading
/// the newest entries until the page is full.)
#[tokio::test]
async fn every_ledger_filter_searches_its_index_on_postgres() {
    let (_ledger, settings) = ledger_on(PolicyBackend::Postgres).await;
    let pool = sqlx::PgPool::connect(&settings.database_url).await.unwrap();
    sqlx::query(
        "INSERT INTO ledger_entries (id, at, kind, action, subject, amount) \
         SELECT 'e' || g, TIMESTAMPTZ '2026-11-21T12:00:00Z' - g * INTERVAL '1 second', \
                CASE WHEN g % 100 = 0 THEN 'refund' ELSE 'charge' END, \
                CASE WHEN g % 1000 = 1 THEN 'rare' ELSE 'act' || (g % 20) END, \
                'subject' || (g % 5000), 1 \
         FROM generate_series(1, 50000) AS g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE ledger_entries")
        .execute(&pool)
        .await
        .unwrap();
    let mut connection = pool.acquire().await.unwrap();
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *connection)
        .await
        .unwrap();
    let minute_ago = start_instant() - Duration::minutes(1);
    let filter = |f: &dyn Fn(&mut LedgerFilter)| {
        let mut filter = LedgerFilter::default();
        f(&mut filter);
        filter
    };
    let shapes = [
        (
            filter(&|f| f.subject = Some("subject7".into())),
            "ledger_entries_subject_seq_idx",
        ),
        (
            filter(&|f| f.action = Some("rare".into())),
            "ledger_entries_action_seq_idx",
        ),
        (
            filter(&|f| f.kind = Some(EntryKind::Refund)),
            "ledger_entries_kind_seq_idx",
        ),
        (
            filter(&|f| {
                f.action = Some("rare".into());
                f.kind = Some(EntryKind::Refund);
            }),
            "ledger_entries_action_kind_seq_idx",
        ),
        (
            filter(&|f| {
                f.from = Some(minute_ago);
                f.to = Some(start_instant());
            }),
            "ledger_entries_at_idx",
        ),
        (
            filter(&|f| {
                f.subject = Some("subject7".into());
                f.kind = Some(EntryKind::Charge);
                f.from = Some(start_instant() - Duration::days(1));
            }),
            "ledger_entries_subject_seq_idx",
        ),
    ];
    for (filter, index) in &shapes {
        // The statement as the API runs it, its parameters written in as literals.
        let mut sql = quota_ledger::ledger::query::page_statement(true, filter, None);
        let mut values: Vec<String> = Vec::new();
        for text in [&filter.subject, &filter.action] {
            values.extend(text.as_ref().map(|t| format!("'{t}'")));
        }
        values.extend(filter.kind.map(|k| format!("'{}'", k.as_str())));
        for at in [filter.from, filter.to] {
            values.extend(at.map(|at| format!("TIMESTAMPTZ '{}'", at.to_rfc3339())));
        }
        values.push("100".to_owned());
        for (i, value) in values.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), value);
        }
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
            .fetch_all(&mut *connection)
            .await
            .unwrap();
        assert!(
            plan.iter().any(|line| reads_index(line, index)),
            "{sql}: {plan:#?}"
        );
    }
}

/// Whether a line of a plan reads `index` of `ledger_entries`, or its counterpart on one
/// of the ledger's partitions (`ledger_entries_p20261121_subject_seq_idx`,
/// `ledger_entries_before_subject_seq_idx` for `ledger_entries_subject_seq_idx`).
fn reads_index(line: &str, index: &str) -> bool {
    let suffix = index
        .strip_prefix("ledger_entries_")
        .expect("an index of the ledger");
    line.split_whitespace().any(|word| {
        let Some(rest) = word.strip_prefix("ledger_entries_") else {
            return false;
        };
        let day = rest.strip_prefix('p').and_then(|r| {
            let (digits, after) = r.split_at_checked(8)?;
            digits
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then_some(after)?
                .strip_prefix('_')
        });
        let rest = rest.strip_prefix("before_").or(day).unwrap_or(rest);
        rest == suffix
    })
}

#[test]
fn a_plan_reads_an_index_of_the_ledger_or_of_a_partition() {
    let subject = "ledger_entries_subject_seq_idx";
    for line in [
        "Index Scan Backward using ledger_entries_subject_seq_idx on ledger_entries",
        "-> Index Scan using ledger_entries_p20261121_subject_seq_idx on ledger_entries_p20261121",
        "Index Scan using ledger_entries_before_subject_seq_idx on ledger_entries_before_20261121",
    ] {
        assert!(reads_index(line, subject), "{line}");
    }
    let kind = "ledger_entries_kind_seq_idx";
    for line in [
        "Index Scan using ledger_entries_p20261121_action_kind_seq_idx on ledger_entries_p20261121",
        "Seq Scan on ledger_entries_p20261121",
    ] {
        assert!(!reads_index(line, kind), "{line}");
    }
}
