//! Micro-benchmarks of the pure parts of the consume path, so that regressions show up in
//! numbers: calendar window math, counter-key encoding and the in-process store's decision
//! (read, decide, charge and assemble the outcomes).
//!
//! `cargo bench --bench hot_path` runs them; `cargo test --benches` only checks that they run.
//! Compare figures taken on the same machine in one sitting: a shared machine is noisy.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::America::New_York;
use chrono_tz::Asia::Kathmandu;
use chrono_tz::Europe::Berlin;
use chrono_tz::Tz;
use criterion::{criterion_group, criterion_main, Criterion};
use quota_ledger::counters::memory::MemoryCounterStore;
use quota_ledger::domain::{
    Action, Anchors, CalendarPeriod, Measure, Policy, PolicyId, PolicySpec, Subject, Window,
};
use quota_ledger::engine::decision::window::calendar_bounds;
use quota_ledger::engine::store::{Algorithm, Charge, CounterStore, Evaluation, StoreError};
use quota_ledger::keys::{policy_key, SubjectKeys};

/// Saturday 2026-11-21 15:30:00 UTC.
fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 15, 30, 0)
        .single()
        .expect("a valid instant")
}

fn window_math(c: &mut Criterion) {
    let mut group = c.benchmark_group("calendar_bounds");
    let plain = Anchors::default();
    // A bank's day: from a 04:00 cut-off; a billing month from the 15th.
    let cut_off = Anchors {
        day_start: 240,
        ..plain
    };
    let billing = Anchors {
        month_day: 15,
        ..plain
    };
    let cases = [
        ("day/UTC", CalendarPeriod::Day, plain, Tz::UTC),
        ("day/America/New_York", CalendarPeriod::Day, plain, New_York),
        (
            "day 04:00/America/New_York",
            CalendarPeriod::Day,
            cut_off,
            New_York,
        ),
        ("month/Europe/Berlin", CalendarPeriod::Month, plain, Berlin),
        (
            "month 15th/Europe/Berlin",
            CalendarPeriod::Month,
            billing,
            Berlin,
        ),
        (
            "hour/Asia/Kathmandu",
            CalendarPeriod::Hour,
            plain,
            Kathmandu,
        ),
    ];
    for (name, period, anchors, tz) in cases {
        group.bench_function(name, |b| {
            b.iter(|| {
                calendar_bounds(
                    black_box(period),
                    black_box(anchors),
                    black_box(tz),
                    black_box(now()),
                )
            })
        });
    }
    group.finish();
}

fn policy(id: &str, measure: Measure, window: Window) -> Policy {
    Policy {
        id: PolicyId::parse("id", id).expect("valid"),
        spec: PolicySpec::example("transfer", measure, 1_000_000, window),
        created_at: now(),
        updated_at: now(),
        version: 1,
    }
}

fn key_encoding(c: &mut Criterion) {
    let action = Action::parse("action", "transfer").expect("valid");
    let subject = Subject::parse("subject", "user-1234567").expect("valid");
    let awkward = Subject::parse("subject", "{tenant}%user-42").expect("valid");
    let window = Window::calendar(CalendarPeriod::Day, "America/New_York").expect("valid");
    let daily = policy("transfers-per-day", Measure::Count, window);
    let key = policy_key(&daily);
    let keys = SubjectKeys::new("ql", &action, &subject);
    let mut group = c.benchmark_group("keys");
    group.bench_function("subject_keys", |b| {
        b.iter(|| SubjectKeys::new(black_box("ql"), black_box(&action), black_box(&subject)))
    });
    group.bench_function("subject_keys/awkward_subject", |b| {
        b.iter(|| SubjectKeys::new(black_box("ql"), black_box(&action), black_box(&awkward)))
    });
    group.bench_function("counter_key/calendar", |b| {
        b.iter(|| black_box(&keys).counter(black_box(&key), black_box(Some(1_795_237_200))))
    });
    group.bench_function("counter_key/rolling", |b| {
        b.iter(|| black_box(&keys).counter(black_box(&key), black_box(None)))
    });
    // Done once per policy when the cache is built, not per request; measured to show why.
    group.bench_function("policy_key", |b| b.iter(|| policy_key(black_box(&daily))));
    group.finish();
}

/// Runs a future that never waits (the memory store's `evaluate`) to completion.
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the in-process store never waits"),
    }
}

fn charge(key: String, algorithm: Algorithm, cost: u64) -> Charge {
    Charge {
        key: quota_ledger::keys::CounterKey::read(key),
        algorithm,
        limit: 1_000_000_000,
        cost,
        enforce: true,
    }
}

/// One decision per subject of 1,000, round robin, as the engine would ask for it.
fn decisions(subjects: usize, make: impl Fn(&str) -> Vec<Charge>) -> Vec<Vec<Charge>> {
    (0..subjects)
        .map(|i| make(&format!("ql:{{transfer|u{i}}}")))
        .collect()
}

fn decide(
    store: &MemoryCounterStore,
    now_ms: i64,
    charges: &[Charge],
) -> Result<Evaluation, StoreError> {
    ready(store.evaluate(now_ms, charges, true))
}

/// Builds the charges of one decision from a subject's key prefix.
type MakeCharges = Box<dyn Fn(&str) -> Vec<Charge>>;

fn memory_decisions(c: &mut Criterion) {
    let now_ms = now().timestamp_millis();
    let day_end = now_ms + 30_600_000;
    let calendar = Algorithm::Calendar {
        period_end_ms: day_end,
    };
    let rolling = Algorithm::Rolling {
        bucket_ms: 3_600_000,
        buckets: 24,
    };
    let token_bucket = Algorithm::TokenBucket {
        period_ms: 3_600_000,
    };
    let scenarios: [(&str, MakeCharges); 4] = [
        (
            "calendar",
            Box::new(move |tag| vec![charge(format!("{tag}aaaaaaa1xUdCi"), calendar, 1)]),
        ),
        (
            "rolling_24_buckets",
            Box::new(move |tag| vec![charge(format!("{tag}bbbbbbb"), rolling, 1)]),
        ),
        (
            "token_bucket",
            Box::new(move |tag| vec![charge(format!("{tag}ccccccc"), token_bucket, 1)]),
        ),
        (
            "count_and_amount",
            Box::new(move |tag| {
                vec![
                    charge(format!("{tag}aaaaaaa1xUdCi"), calendar, 1),
                    charge(format!("{tag}ddddddd"), rolling, 2_500),
                ]
            }),
        ),
    ];
    let mut group = c.benchmark_group("memory_store_evaluate");
    for (name, make) in &scenarios {
        let store = MemoryCounterStore::new();
        let all = decisions(1_000, make);
        // Every rolling counter holds all 25 buckets that count, as for a subject active all day.
        for hour in (0..=24).rev() {
            for charges in &all {
                decide(&store, now_ms - hour * 3_600_000, charges).expect("decides");
            }
        }
        let mut next = 0;
        group.bench_function(*name, |b| {
            b.iter(|| {
                next = (next + 1) % all.len();
                decide(&store, now_ms, black_box(&all[next]))
            })
        });
    }
    group.finish();
}

criterion_group!(hot_path, window_math, key_encoding, memory_decisions);
criterion_main!(hot_path);
