//! Lifetime counters: usage that never resets, kept with no time to live.

use super::{charge, outcome, Harness, DAY, T0};
use crate::engine::store::{Algorithm, NEVER_MS};

scenarios!(
    a_lifetime_counts_across_years_and_never_expires,
    a_lifetime_denial_has_no_retry_time,
);

const YEAR: i64 = 366 * DAY;

async fn a_lifetime_counts_across_years_and_never_expires(h: &Harness) {
    let key = h.key("prepaid:life");
    let spend = |cost| charge(&key, Algorithm::Lifetime, 1_000, cost);
    assert_eq!(
        h.peek(T0, &spend(0)).await,
        outcome(0, true, NEVER_MS, None),
        "no usage yet, and still no reset time"
    );
    assert_eq!(
        h.one(T0, &spend(400)).await,
        outcome(400, true, NEVER_MS, None)
    );
    assert_eq!(h.ttl_ms(key.as_str(), T0).await, Some(-1), "no TTL");
    for (years, used) in [(1, 800), (10, 1_000)] {
        let at = T0 + years * YEAR;
        let cost = used - if years == 1 { 400 } else { 800 };
        assert_eq!(
            h.one(at, &spend(cost)).await,
            outcome(used, true, NEVER_MS, None),
            "{years} years on"
        );
    }
    assert_eq!(h.ttl_ms(key.as_str(), T0 + 10 * YEAR).await, Some(-1));
}

async fn a_lifetime_denial_has_no_retry_time(h: &Harness) {
    let key = h.key("prepaid:life");
    let spend = |cost| charge(&key, Algorithm::Lifetime, 1_000, cost);
    h.one(T0, &spend(900)).await;
    assert_eq!(
        h.one(T0 + 50 * YEAR, &spend(101)).await,
        outcome(900, false, NEVER_MS, None),
        "over the cap: denied, and it never passes later"
    );
    assert_eq!(
        h.one(T0, &spend(1_001)).await,
        outcome(900, false, NEVER_MS, None),
        "above the cap itself"
    );
    assert_eq!(
        h.one(T0, &spend(100)).await,
        outcome(1_000, true, NEVER_MS, None),
        "up to the cap exactly"
    );
}
