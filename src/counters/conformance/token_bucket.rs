//! Token buckets (GCRA): `limit` per period, refilled smoothly, bursts up to `limit`.

use super::{charge, outcome, token_bucket, Harness, MAX, T0};

scenarios!(
    a_token_bucket_allows_a_burst_up_to_the_limit,
    a_token_bucket_refills_one_unit_per_period_over_limit,
    a_denied_token_bucket_charge_learns_the_exact_moment_it_fits,
    token_buckets_stay_exact_with_limits_near_2_pow_53,
    a_zero_limit_token_bucket_denies_and_never_retries,
);

async fn a_token_bucket_allows_a_burst_up_to_the_limit(h: &Harness) {
    // 10 per 10 s: one unit drains every second.
    let one = charge(&h.key("api"), token_bucket(10_000), 10, 1);
    for used in 1..=10 {
        let resets = T0 + used as i64 * 1_000;
        assert_eq!(
            h.one(T0, &one).await,
            outcome(used, true, resets, None),
            "unit {used}"
        );
    }
    assert_eq!(
        h.one(T0, &one).await,
        outcome(10, false, T0 + 10_000, Some(T0 + 1_000))
    );
}

async fn a_token_bucket_refills_one_unit_per_period_over_limit(h: &Harness) {
    let key = h.key("api");
    let one = charge(&key, token_bucket(10_000), 10, 1);
    assert!(
        h.one(T0, &charge(&key, token_bucket(10_000), 10, 10))
            .await
            .allowed
    );
    // 999 ms later 9.99 units are still used (reported rounded up).
    assert_eq!(
        h.one(T0 + 999, &one).await,
        outcome(10, false, T0 + 10_000, Some(T0 + 1_000))
    );
    assert_eq!(
        h.one(T0 + 1_000, &one).await,
        outcome(10, true, T0 + 11_000, None)
    );
    assert_eq!(h.one(T0 + 1_000, &one).await.retry_at_ms, Some(T0 + 2_000));
    // 4 s later four units are back.
    let four = charge(&key, token_bucket(10_000), 10, 4);
    assert_eq!(
        h.one(T0 + 5_000, &four).await,
        outcome(10, true, T0 + 15_000, None)
    );
}

async fn a_denied_token_bucket_charge_learns_the_exact_moment_it_fits(h: &Harness) {
    // 3 per second: 3 units drain in 1000 ms, so a unit takes 333.3 ms.
    let key = h.key("api");
    assert!(
        h.one(T0, &charge(&key, token_bucket(1_000), 3, 3))
            .await
            .allowed
    );
    let two = charge(&key, token_bucket(1_000), 3, 2);
    // Two units fit once usage is down to 1: after 2000 / 3 = 666.7 ms, i.e. at +667.
    assert_eq!(
        h.one(T0, &two).await,
        outcome(3, false, T0 + 1_000, Some(T0 + 667))
    );
    assert_eq!(
        h.one(T0 + 666, &two).await,
        outcome(2, false, T0 + 1_000, Some(T0 + 667))
    );
    assert_eq!(
        h.one(T0 + 667, &two).await,
        outcome(3, true, T0 + 1_667, None)
    );
}

async fn token_buckets_stay_exact_with_limits_near_2_pow_53(h: &Harness) {
    // limit × period_ms = 9_007_199_254_740_000, just below 2^53.
    let (limit, period) = (MAX / 1_000, 1_000u64);
    let key = h.key("bytes");
    let burst = charge(&key, token_bucket(period as i64), limit, limit);
    assert_eq!(
        h.one(T0, &burst).await,
        outcome(limit, true, T0 + 1_000, None)
    );
    let one = charge(&key, token_bucket(period as i64), limit, 1);
    assert_eq!(
        h.one(T0, &one).await,
        outcome(limit, false, T0 + 1_000, Some(T0 + 1))
    );
    // 1 ms drains `limit` units of S = used × 1000, then one unit is added.
    // It drains in ceil(S / limit) = 1000 ms from T0 + 1.
    let used = (limit * period - limit + period).div_ceil(period);
    assert_eq!(
        h.one(T0 + 1, &one).await,
        outcome(used, true, T0 + 1_001, None)
    );

    // limit = 2^53 - 1 per millisecond.
    let key = h.key("max");
    let all = charge(&key, token_bucket(1), MAX, MAX);
    assert_eq!(h.one(T0, &all).await, outcome(MAX, true, T0 + 1, None));
    let one = charge(&key, token_bucket(1), MAX, 1);
    assert_eq!(
        h.one(T0, &one).await,
        outcome(MAX, false, T0 + 1, Some(T0 + 1))
    );
    assert_eq!(h.one(T0 + 1, &one).await, outcome(1, true, T0 + 2, None));
}

async fn a_zero_limit_token_bucket_denies_and_never_retries(h: &Harness) {
    let one = charge(&h.key("api"), token_bucket(1_000), 0, 1);
    assert_eq!(h.one(T0, &one).await, outcome(0, false, T0, None));
    let nothing = charge(&h.key("api"), token_bucket(1_000), 0, 0);
    assert_eq!(h.one(T0, &nothing).await, outcome(0, true, T0, None));
}
