//! The ledger at scale, for the ledger rows of `scripts/bench.sh`: fills a fresh ledger
//! (SQLite, or Postgres partitioned by day) with `entries` entries spread over the last 24 hours, written
//! through the service's own store and codec in batches as the drain writes them, then
//! times what the API reads from it: the console's Today page (`/admin/activity` over 24
//! hours: the hourly rollups and the most-denied subjects) and the query API's filters.
//! One line is printed (times in milliseconds, each the median of 5 calls):
//!
//! ```text
//! LEDGER entries=N fill_s=S fill_rate=R activity_ms=X kind_action_ms=X kind_ms=X subject_ms=X
//! ```
//!
//! The entries: 20 actions, 100,000 subjects, one in 50 a recorded denial, one in 1,000 a
//! refund; `kind_action_ms` asks for the refunds of one action, of which there are none
//! (the query that read every entry of the action before it had an index of its own).
//!
//! With a third argument, `counters`, each charge also names the counter it charged (the
//! calendar day, UTC, of policy `fill-day`, under the default key prefix `ql`), as a
//! consume's entry does: a ledger for a Redis-mode service to rebuild its counters from
//! (the bench's Redis-loss row). Then it only fills.
//!
//! ```sh
//! cargo build --release --example ledger_scale
//! target/release/examples/ledger_scale sqlite:///tmp/ledger.db?mode=rwc 10000000
//! ```

use chrono::{DateTime, Duration, Utc};
use quota_ledger::domain::{
    Action, CalendarPeriod, CounterCharge, EntryId, EntryKind, LedgerEntry, Measure, Policy,
    PolicyAmount, PolicyId, PolicySpec, Restore, Scope, Subject, Window,
};
use quota_ledger::engine::ledger::{LedgerFilter, LedgerStore};
use quota_ledger::keys::{policy_key, PolicyKey, SubjectKeys};
use std::time::Instant;

/// Entries per append: one drain batch.
const BATCH: u64 = 5_000;

/// Entry `i` of `n`, spread evenly over the 24 hours before `now`.
/// The policy whose counters the entries charge, when they name them.
fn fill_policy(id: &PolicyId) -> Policy {
    let window = Window::calendar(CalendarPeriod::Day, "UTC").expect("a valid window");
    Policy {
        id: id.clone(),
        spec: PolicySpec::example("fill0", Measure::Count, 1_000_000, window),
        created_at: DateTime::UNIX_EPOCH,
        updated_at: DateTime::UNIX_EPOCH,
        version: 1,
    }
}

/// The counter a charge of `entry` at its time put its unit on (the UTC day's).
fn counter_of(entry: &LedgerEntry, key: &PolicyKey) -> CounterCharge {
    let day = entry.at.timestamp() - entry.at.timestamp().rem_euclid(86_400);
    let keys = SubjectKeys::new("ql", &entry.action, &entry.subject);
    CounterCharge {
        policy_id: entry.policies[0].policy_id.clone(),
        key: keys.counter(key, Some(day)).as_str().to_owned(),
        restore: Restore::Calendar {
            period_end_ms: (day + 86_400) * 1_000,
        },
        by_amount: false,
        charged: 1,
        scope: Scope::default(),
    }
}

fn entry(i: u64, n: u64, now: DateTime<Utc>, policy: &PolicyId) -> LedgerEntry {
    let back_ms = i64::try_from((n - i) * 86_400_000 / n.max(1)).unwrap_or(0);
    let kind = match i {
        _ if i % 1_000 == 999 => EntryKind::Refund,
        _ if i % 50 == 49 => EntryKind::Deny,
        _ => EntryKind::Charge,
    };
    let action = format!("fill{}", i % 20);
    let subject = format!("subject-{}", i % 100_000);
    LedgerEntry {
        folded: Vec::new(),
        id: EntryId::parse(&uuid::Uuid::now_v7().to_string()).expect("a UUIDv7 is an entry id"),
        at: now - Duration::milliseconds(back_ms),
        kind,
        action: Action::parse("action", &action).expect("a valid action"),
        subject: Subject::parse("subject", &subject).expect("a valid subject"),
        amount: 1,
        consumption_id: None,
        hold_id: None,
        idempotency_key: None,
        policies: vec![PolicyAmount {
            policy_id: policy.clone(),
            amount: 1,
            scope: Default::default(),
        }],
        attributes: Default::default(),
        counters: Vec::new(),
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
    }
}

/// The median, in milliseconds, of 5 runs of `call`.
async fn median_ms<F, Fut>(mut call: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        call().await;
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    times.sort_by(f64::total_cmp);
    times[2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: ledger_scale <database url> <entries> [counters]");
        std::process::exit(2);
    };
    quota_ledger::db::migrate_url(url).await.expect("migrating");
    let now = Utc::now();
    // On Postgres, partitioned by day as a service's start leaves it: converted as of a
    // week and a day ago, so that the last 24 hours fall in partitions of their own.
    quota_ledger::ledger::partitions::look_url(url, now - Duration::days(8))
        .await
        .expect("partitioning");
    let store = quota_ledger::ledger::sql::connect(url)
        .await
        .expect("connecting");
    let policy = PolicyId::parse("policy_id", "fill-day").expect("a valid id");
    let counter_key = (args.get(3).map(String::as_str) == Some("counters"))
        .then(|| policy_key(&fill_policy(&policy)));
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + BATCH).min(n);
        let batch: Vec<_> = (i..end)
            .map(|j| {
                let mut entry = entry(j, n, now, &policy);
                if let (Some(key), EntryKind::Charge) = (&counter_key, entry.kind) {
                    entry.counters = vec![counter_of(&entry, key)];
                }
                entry
            })
            .collect();
        store.append(&batch).await.expect("appending");
        i = end;
    }
    let fill_s = started.elapsed().as_secs_f64();
    if counter_key.is_some() {
        println!("LEDGER entries={n} fill_s={fill_s:.2}");
        return;
    }

    let hour = now - Duration::seconds(now.timestamp() % 3_600);
    let (from, to) = (hour - Duration::hours(23), hour + Duration::hours(1));
    let store: &dyn LedgerStore = store.as_ref();
    let activity = median_ms(|| async {
        store.activity(from, to, None).await.expect("activity");
        store
            .top_denied(from, to, None, 10)
            .await
            .expect("top denied");
    })
    .await;
    let page = |filter: LedgerFilter| async move {
        store.page(&filter, 100, None).await.expect("a page");
    };
    let kind_action = median_ms(|| {
        page(LedgerFilter {
            action: Some("fill3".to_owned()),
            kind: Some(EntryKind::Refund),
            ..LedgerFilter::default()
        })
    })
    .await;
    let kind = median_ms(|| {
        page(LedgerFilter {
            kind: Some(EntryKind::Refund),
            ..LedgerFilter::default()
        })
    })
    .await;
    let subject = median_ms(|| {
        page(LedgerFilter {
            subject: Some("subject-4242".to_owned()),
            ..LedgerFilter::default()
        })
    })
    .await;
    println!(
        "LEDGER entries={n} fill_s={fill_s:.1} fill_rate={:.0} activity_ms={activity:.1} \
         kind_action_ms={kind_action:.1} kind_ms={kind:.1} subject_ms={subject:.1}",
        n as f64 / fill_s.max(1e-9)
    );
}
