//! Rolling windows: W = 10 s in buckets of B = 1 s (T0 starts a bucket).

use super::{charge, outcome, rolling, Algorithm, Harness, T0};

scenarios!(
    a_rolling_window_never_holds_more_than_the_limit_in_any_trailing_window,
    a_rolling_unit_stops_counting_between_w_and_w_plus_b_after_its_charge,
    stale_rolling_buckets_are_ignored_and_dropped_by_the_next_charge,
    rolling_units_charged_by_a_clock_running_ahead_count_at_once,
    a_denied_rolling_charge_learns_the_first_moment_it_fits,
    a_rolling_counter_resets_when_its_newest_unit_stops_counting,
);

const B: i64 = 1_000;
const W: i64 = 10_000;

fn window() -> Algorithm {
    rolling(B, W / B)
}

async fn a_rolling_window_never_holds_more_than_the_limit_in_any_trailing_window(h: &Harness) {
    let one = charge(&h.key("calls"), window(), 5, 1);
    let mut allowed_at = Vec::new();
    for step in 0..60 {
        let now = T0 + step * 700;
        if h.one(now, &one).await.allowed {
            allowed_at.push(now);
        }
    }
    for &end in &allowed_at {
        let in_window = allowed_at
            .iter()
            .filter(|&&t| t >= end - W && t <= end)
            .count();
        assert!(
            in_window <= 5,
            "{in_window} units in the window ending at {end}"
        );
    }
    // 42 s: 5 at once, then 5 more each time a full window (plus at most a bucket) has passed.
    assert_eq!(allowed_at.len(), 20, "allowed at {allowed_at:?}");
}

async fn a_rolling_unit_stops_counting_between_w_and_w_plus_b_after_its_charge(h: &Harness) {
    let one = charge(&h.key("calls"), window(), 5, 1);
    let charged_at = T0 + 500;
    let stops_at = T0 + W + B; // the start of the bucket W/B + 1 after the unit's bucket
    assert_eq!(
        h.one(charged_at, &one).await,
        outcome(1, true, stops_at, None)
    );
    assert_eq!(
        h.peek(charged_at + W, &one).await.used,
        1,
        "W after its charge"
    );
    assert_eq!(
        h.peek(stops_at - 1, &one).await.used,
        1,
        "W + B/2 - 1 ms after its charge"
    );
    assert_eq!(
        h.peek(stops_at, &one).await,
        outcome(0, true, stops_at, None)
    );
}

async fn stale_rolling_buckets_are_ignored_and_dropped_by_the_next_charge(h: &Harness) {
    let key = h.key("calls");
    assert!(h.one(T0, &charge(&key, window(), 5, 2)).await.allowed);
    assert!(
        h.one(T0 + 5_000, &charge(&key, window(), 5, 3))
            .await
            .allowed
    );
    let later = T0 + W + B; // T0's bucket no longer counts
    assert_eq!(h.peek(later, &charge(&key, window(), 5, 2)).await.used, 3);
    assert_eq!(h.bucket_count(&key).await, 2, "a peek deletes nothing");
    let charged = h.one(later, &charge(&key, window(), 5, 2)).await;
    assert_eq!(charged, outcome(5, true, later + W + B, None));
    assert_eq!(
        h.bucket_count(&key).await,
        2,
        "T0's bucket is gone, `later`'s is new"
    );
}

async fn rolling_units_charged_by_a_clock_running_ahead_count_at_once(h: &Harness) {
    let key = h.key("calls");
    let ahead = T0 + 5_000;
    assert!(h.one(ahead, &charge(&key, window(), 3, 2)).await.allowed);
    // Back on a clock 5 s behind: the future bucket counts and sets when usage resets.
    let one = charge(&key, window(), 3, 1);
    assert_eq!(h.one(T0, &one).await, outcome(3, true, ahead + W + B, None));
    // Denied until T0's unit stops counting (the future units alone leave room for one).
    assert_eq!(
        h.one(T0, &one).await,
        outcome(3, false, ahead + W + B, Some(T0 + W + B))
    );
    let ttl = h.ttl_ms(&key, T0).await.unwrap_or(0);
    assert!(
        ttl > ahead + W + B - T0,
        "the TTL covers the future bucket: {ttl}"
    );
}

async fn a_denied_rolling_charge_learns_the_first_moment_it_fits(h: &Harness) {
    let key = h.key("calls");
    for (at, cost) in [(T0, 2), (T0 + 3_000, 2), (T0 + 5_000, 1)] {
        assert!(h.one(at, &charge(&key, window(), 5, cost)).await.allowed);
    }
    let three = charge(&key, window(), 5, 3);
    // Leaving T0's bucket (at T0 + 11 s) frees 2: 3 + 3 > 5; leaving T0 + 3 s's frees 2 more.
    let fits_at = T0 + 3_000 + W + B;
    assert_eq!(
        h.one(T0 + 6_000, &three).await,
        outcome(5, false, T0 + 5_000 + W + B, Some(fits_at))
    );
    assert_eq!(h.one(fits_at - 1, &three).await.retry_at_ms, Some(fits_at));
    assert_eq!(
        h.one(fits_at, &three).await,
        outcome(4, true, fits_at + W + B, None)
    );
}

async fn a_rolling_counter_resets_when_its_newest_unit_stops_counting(h: &Harness) {
    let one = charge(&h.key("calls"), window(), 5, 1);
    assert_eq!(h.one(T0, &one).await.resets_at_ms, T0 + W + B);
    let resets = T0 + 4_000 + W + B;
    assert_eq!(
        h.one(T0 + 4_200, &one).await,
        outcome(2, true, resets, None)
    );
    assert_eq!(
        h.peek(resets - 1, &one).await,
        outcome(1, true, resets, None)
    );
    assert_eq!(h.peek(resets, &one).await, outcome(0, true, resets, None));
}
