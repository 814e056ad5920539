//! Give-backs report each counter's usage before and after them (what alert thresholds
//! are checked against), whatever the window, as a decision would read it.

use super::{calendar, charge, rolling, token_bucket, Harness, DAY, T0};
use crate::domain::{CounterCharge, PolicyId, Restore, Scope};
use crate::engine::store::{Algorithm, GiveBack, GiveBackKind, GivenBack};

scenarios!(a_refund_reports_usage_before_and_after_on_every_window);

/// A counter of policy `p` charged `charged`, given back as `restore` says.
pub(super) fn counter(key: &str, restore: Restore, by_amount: bool, charged: u64) -> CounterCharge {
    CounterCharge {
        policy_id: PolicyId::parse("id", "p").expect("a valid id"),
        key: key.to_owned(),
        restore,
        by_amount,
        charged,
        scope: Scope::default(),
    }
}

/// The counters charged above, each given back as its window says.
fn six_counters(keys: &[String; 6], end: i64, period_ms: i64) -> Vec<CounterCharge> {
    vec![
        counter(&keys[0], Restore::Calendar { period_end_ms: end }, true, 7),
        counter(
            &keys[1],
            Restore::Rolling {
                bucket: T0 / 1_000,
                bucket_ms: 1_000,
                buckets: 10,
            },
            true,
            5,
        ),
        counter(
            &keys[2],
            Restore::TokenBucket {
                period_ms,
                limit: 10,
            },
            true,
            6,
        ),
        counter(
            &keys[3],
            Restore::ZonedCalendar {
                period_end_ms: end,
                charged_at_ms: T0,
            },
            true,
            4,
        ),
        counter(&keys[4], Restore::Lifetime, true, 9),
        // A count policy gets nothing back of a partial refund.
        counter(&keys[5], Restore::Calendar { period_end_ms: end }, false, 1),
    ]
}

async fn a_refund_reports_usage_before_and_after_on_every_window(h: &Harness) {
    let end = T0 + DAY;
    let keys = ["cal", "roll", "bucket", "zoned", "life", "count"].map(|k| h.key(k));
    let period_ms = 100_000;
    h.one(T0, &charge(&keys[0], calendar(end), 100, 7)).await;
    h.one(T0, &charge(&keys[1], rolling(1_000, 10), 100, 5))
        .await;
    h.one(T0 + 2_000, &charge(&keys[1], rolling(1_000, 10), 100, 2))
        .await;
    h.one(T0, &charge(&keys[2], token_bucket(period_ms), 10, 6))
        .await;
    let zoned = Algorithm::ZonedCalendar { period_end_ms: end };
    h.one(T0, &charge(&keys[3], zoned, 100, 4)).await;
    h.one(T0, &charge(&keys[4], Algorithm::Lifetime, 100, 9))
        .await;
    h.one(T0, &charge(&keys[5], calendar(end), 100, 1)).await;
    let counters = six_counters(&keys, end, period_ms);
    let refund = |refunded, reports_usage| GiveBack {
        kind: GiveBackKind::Refund {
            amount: 3,
            total: 10,
            refunded,
        },
        control_key: h.key("refunded"),
        hold_index: None,
        counters: counters.clone(),
        ledger: None,
        idempotency: None,
        pending: None,
        reports_usage,
    };
    // 3 s on, the token bucket has drained 3,000 × 10 of its 600,000 (6 units): 5.7 → 6.
    let now = T0 + 3_000;
    let given = h
        .store
        .give_back(now, &refund(0, true))
        .await
        .expect("a refund");
    let GivenBack::Done { usage, .. } = given else {
        panic!("not done: {given:?}");
    };
    assert_eq!(usage, "7,4;7,4;6,3;4,1;9,6;0,0");
    let given = h
        .store
        .give_back(now, &refund(3, false))
        .await
        .expect("a refund");
    let GivenBack::Done {
        usage, refunded, ..
    } = given
    else {
        panic!("not done: {given:?}");
    };
    assert_eq!(
        (usage.as_str(), refunded),
        ("", 6),
        "reported only when asked"
    );
}
