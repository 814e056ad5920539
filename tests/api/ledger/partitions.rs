//! The ledger partitioned by day on Postgres (`quota_ledger::ledger::partitions`): a
//! fresh ledger and a full one converted, no row moved and no index built; never while
//! an earlier release is live; a day without a partition made on demand; retention
//! dropping whole days.

use super::{entry, everything, ids};
use crate::helpers::{fresh_settings, start_instant, CounterBackend, PolicyBackend};
use chrono::Duration;
use quota_ledger::engine::ledger::LedgerFilter;
use quota_ledger::ledger::partitions::{look_url, Look, AHEAD_DAYS, BOUND_DAYS};
use sqlx::PgPool;

/// The partitions of `ledger_entries`, by name, in order.
async fn partitions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'ledger_entries'::regclass ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `pg_class.relkind` of `ledger_entries`: `p` partitioned, `r` an ordinary table.
async fn kind(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'ledger_entries'::regclass")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The object id of each relation named in `names` (`None` when there is none).
async fn oids(pool: &PgPool, names: &[&str]) -> Vec<Option<i64>> {
    let mut out = Vec::new();
    for name in names {
        let oid: Option<i64> =
            sqlx::query_scalar("SELECT oid::bigint FROM pg_class WHERE relname = $1")
                .bind(*name)
                .fetch_optional(pool)
                .await
                .unwrap();
        out.push(oid);
    }
    out
}

/// The partition each entry of the ledger is in, with how many.
async fn rows_per_partition(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT tableoid::regclass::text, count(*) FROM ledger_entries GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_full_ledger_is_converted_moving_no_row_and_building_no_index_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let url = &settings.database_url;
    quota_ledger::db::migrate_url(url).await.unwrap();
    let ledger = quota_ledger::ledger::sql::connect(url).await.unwrap();
    let pool = PgPool::connect(url).await.unwrap();
    let written: Vec<_> = (0..300)
        .map(|i| entry(&format!("e{i}"), &format!("s{}", i % 7), i * 60))
        .collect();
    assert_eq!(ledger.append(&written).await.unwrap(), 300);
    let before = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    let hourly: i64 = sqlx::query_scalar("SELECT CAST(SUM(charges) AS BIGINT) FROM ledger_hourly")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(hourly, 300);
    let old = [
        "ledger_entries",
        "ledger_entries_subject_seq_idx",
        "ledger_entries_at_idx",
        "ledger_entries_consumption_idx",
    ];
    let old_oids = oids(&pool, &old).await;
    assert_eq!(kind(&pool).await, "r");

    let look = look_url(url, start_instant()).await.unwrap();
    assert_eq!(look, Some(Look::Converted { created: 1 }));
    assert_eq!(kind(&pool).await, "p");
    // The old table and its indexes are the old partition's: the same relations, renamed.
    let bound = (start_instant() + Duration::days(BOUND_DAYS as i64)).format("%Y%m%d");
    let renamed = [
        format!("ledger_entries_before_{bound}"),
        "ledger_entries_before_subject_seq_idx".to_owned(),
        "ledger_entries_before_at_idx".to_owned(),
        "ledger_entries_before_consumption_idx".to_owned(),
    ];
    let renamed: Vec<&str> = renamed.iter().map(String::as_str).collect();
    assert_eq!(oids(&pool, &renamed).await, old_oids);
    assert_eq!(
        partitions(&pool).await,
        [
            format!("ledger_entries_before_{bound}"),
            format!("ledger_entries_p{bound}")
        ]
    );

    // Every entry reads as before, in the same order (their seq kept); one appended again
    // is still a no-op; a new one comes after them all, and is rolled up.
    assert_eq!(
        everything(ledger.as_ref(), &LedgerFilter::default()).await,
        before
    );
    assert_eq!(ledger.append(&written[..10]).await.unwrap(), 0);
    let new = entry("new", "s1", 300 * 60);
    assert_eq!(ledger.append(std::slice::from_ref(&new)).await.unwrap(), 1);
    let all = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(all.len(), 301);
    assert_eq!(ids(&all[..1]), ["new"]);
    let hourly: i64 = sqlx::query_scalar("SELECT CAST(SUM(charges) AS BIGINT) FROM ledger_hourly")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(hourly, 301);
    // Looked at again: nothing to convert, the days ahead there.
    let again = look_url(url, start_instant()).await.unwrap();
    assert_eq!(again, Some(Look::Partitioned { created: 0 }));
}

#[tokio::test]
async fn a_day_without_a_partition_gets_one_when_an_entry_needs_it_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let url = &settings.database_url;
    quota_ledger::db::migrate_url(url).await.unwrap();
    // Converted 8 days before the start: the old table ends the day before it, the
    // partitions made ahead with that day; the start's day has none yet.
    let converted_at = start_instant() - Duration::days(8);
    let look = look_url(url, converted_at).await.unwrap();
    assert_eq!(look, Some(Look::Converted { created: 1 }));
    let ledger = quota_ledger::ledger::sql::connect(url).await.unwrap();
    let pool = PgPool::connect(url).await.unwrap();
    let day = 86_400;
    let written = [
        entry("old", "s", -2 * day),
        entry("first", "s", 0),
        entry("later", "s", 30 * day),
        entry("much-later", "s", 400 * day),
    ];
    assert_eq!(ledger.append(&written).await.unwrap(), 4);
    let name = |days: i64| {
        format!(
            "ledger_entries_p{}",
            (start_instant() + Duration::days(days)).format("%Y%m%d")
        )
    };
    let before = format!(
        "ledger_entries_before_{}",
        (start_instant() - Duration::days(1)).format("%Y%m%d")
    );
    assert_eq!(
        rows_per_partition(&pool).await,
        [(before, 1), (name(0), 1), (name(30), 1), (name(400), 1)]
    );
    assert_eq!(partitions(&pool).await.len(), 5);
    let read = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(ids(&read), ["much-later", "later", "first", "old"]);
}

#[tokio::test]
async fn the_ledger_stays_one_table_while_an_earlier_release_is_live_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let url = &settings.database_url;
    quota_ledger::db::migrate_url(url).await.unwrap();
    let pool = PgPool::connect(url).await.unwrap();
    let now = start_instant();
    let announce = |seen: chrono::DateTime<chrono::Utc>| {
        sqlx::query(
            "INSERT INTO service_instances (instance_id, version, formats, started_at, seen_at) \
             VALUES ('old', '0.1.0', 1, $1, $1) \
             ON CONFLICT (instance_id) DO UPDATE SET seen_at = excluded.seen_at",
        )
        .bind(seen)
        .execute(&pool)
    };
    announce(now - Duration::seconds(10)).await.unwrap();
    assert_eq!(
        look_url(url, now).await.unwrap(),
        Some(Look::Waiting { oldest: 1 })
    );
    assert_eq!(kind(&pool).await, "r");
    // Gone for two minutes: converted.
    announce(now - Duration::minutes(2)).await.unwrap();
    assert!(matches!(
        look_url(url, now).await.unwrap(),
        Some(Look::Converted { .. })
    ));
    assert_eq!(kind(&pool).await, "p");
}

#[tokio::test]
async fn retention_drops_whole_days_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let url = &settings.database_url;
    let day = 86_400;
    // The old table ends 13 days before the start (converted 20 days before it).
    quota_ledger::db::migrate_url(url).await.unwrap();
    let early = quota_ledger::ledger::sql::connect(url).await.unwrap();
    early
        .append(&[entry("oldest", "s", -20 * day)])
        .await
        .unwrap();
    let converted_at = start_instant() - Duration::days(20);
    assert!(matches!(
        look_url(url, converted_at).await.unwrap(),
        Some(Look::Converted { .. })
    ));
    let ledger = quota_ledger::ledger::sql::connect(url).await.unwrap();
    let written = [
        entry("d-10a", "s", -10 * day),
        entry("d-10b", "s", -10 * day + 60),
        entry("d-9", "s", -9 * day),
        entry("d-1", "s", -day),
        entry("d0", "s", 0),
    ];
    assert_eq!(ledger.append(&written).await.unwrap(), 5);
    let pool = PgPool::connect(url).await.unwrap();
    let count = partitions(&pool).await.len();
    // Five days back, at noon: the old table (ended day -13), days -10 and -9 go whole;
    // so do the empty days ahead of the conversion (-20 to -13).
    let cutoff = start_instant() - Duration::days(5) + Duration::hours(12);
    let removed = ledger.delete_older_than(cutoff, 1_000).await.unwrap();
    assert_eq!(removed, 4);
    let left = everything(ledger.as_ref(), &LedgerFilter::default()).await;
    assert_eq!(ids(&left), ["d0", "d-1"]);
    let names = partitions(&pool).await;
    assert!(names.len() < count, "{names:?}");
    assert!(
        names
            .iter()
            .all(|name| !name.starts_with("ledger_entries_before_")),
        "{names:?}"
    );
    assert_eq!(
        rows_per_partition(&pool).await.len(),
        2,
        "the days of the entries left"
    );
    assert_eq!(ledger.delete_older_than(cutoff, 1_000).await.unwrap(), 0);
}

#[tokio::test]
async fn a_started_service_partitions_its_ledger_on_postgres() {
    let settings = fresh_settings(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let url = settings.database_url.clone();
    let _app = crate::helpers::spawn_with(settings).await;
    let pool = PgPool::connect(&url).await.unwrap();
    let names = crate::helpers::eventually(
        std::time::Duration::from_secs(20),
        "the started service partitions its ledger",
        || {
            let pool = pool.clone();
            async move { (kind(&pool).await == "p").then_some(()) }
        },
    )
    .await;
    let () = names;
    // The old table, up to BOUND_DAYS after the (test clock's) start, then the days
    // ahead from there.
    let names = partitions(&pool).await;
    let days_after_bound = AHEAD_DAYS - BOUND_DAYS + 1;
    assert_eq!(names.len() as u64, 1 + days_after_bound, "{names:?}");
}
