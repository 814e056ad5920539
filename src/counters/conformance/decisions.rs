//! Whole decisions: all or nothing, shadow charges, peeks, zero costs, lowered limits, TTLs
//! and the argument checks.

use super::{calendar, charge, outcome, rolling, shadow, token_bucket, Harness, DAY, MAX, T0};
use crate::engine::store::{Charge, StoreError, KEY_GRACE_MS};

scenarios!(
    one_denied_enforced_charge_applies_no_charge_at_all,
    a_failing_shadow_charge_is_charged_and_reported_but_does_not_deny,
    shadow_usage_saturates_at_2_pow_53_minus_1,
    a_peek_reports_the_charge_but_changes_nothing,
    a_zero_cost_charge_creates_no_key,
    a_limit_lowered_below_usage_denies_and_reports_the_usage,
    every_charged_key_expires_once_its_usage_is_gone_plus_the_grace,
    malformed_decisions_are_rejected_before_touching_any_key,
    charges_of_several_hash_tags_are_all_or_none_where_the_store_allows_them,
    an_empty_decision_is_allowed,
    concurrent_decisions_never_allow_more_than_the_limit,
);

const END: i64 = T0 + DAY;

/// One charge of each algorithm with the given costs (limit 10 each).
fn three(h: &Harness, costs: [u64; 3]) -> [Charge; 3] {
    [
        charge(&h.key("day"), calendar(END), 10, costs[0]),
        charge(&h.key("roll"), rolling(1_000, 10), 10, costs[1]),
        charge(&h.key("tok"), token_bucket(10_000), 10, costs[2]),
    ]
}

async fn one_denied_enforced_charge_applies_no_charge_at_all(h: &Harness) {
    for failing in 0..3 {
        let mut costs = [3, 3, 3];
        costs[failing] = 11;
        let evaluation = h.eval(T0, &three(h, costs), true).await;
        assert!(!evaluation.allowed, "charge {failing} denies");
        for (i, o) in evaluation.outcomes.iter().enumerate() {
            assert_eq!(
                (o.used, o.allowed),
                (0, i != failing),
                "charge {i}, {failing} failing"
            );
        }
        for c in three(h, costs) {
            assert!(!h.exists(c.key.as_str(), T0).await, "{} was written", c.key);
        }
    }
    // With usage already there, a denial leaves it exactly as it was.
    assert!(h.eval(T0, &three(h, [9, 2, 2]), true).await.allowed);
    let evaluation = h.eval(T0 + 1, &three(h, [2, 2, 2]), true).await;
    assert!(!evaluation.allowed);
    let used: Vec<u64> = evaluation.outcomes.iter().map(|o| o.used).collect();
    assert_eq!(used, [9, 2, 2]);
    let after = h.eval(T0 + 1, &three(h, [0, 0, 0]), false).await;
    assert_eq!(
        after.outcomes.iter().map(|o| o.used).collect::<Vec<_>>(),
        [9, 2, 2]
    );
}

async fn a_failing_shadow_charge_is_charged_and_reported_but_does_not_deny(h: &Harness) {
    let charges = [
        charge(&h.key("enforced"), calendar(END), 10, 3),
        shadow(&h.key("shadow"), calendar(END), 5, 3),
    ];
    let first = h.eval(T0, &charges, true).await;
    assert!(first.allowed);
    assert_eq!(
        first.outcomes,
        [outcome(3, true, END, None), outcome(3, true, END, None)]
    );
    let second = h.eval(T0, &charges, true).await;
    assert!(second.allowed, "a shadow charge never denies");
    assert_eq!(second.outcomes[0], outcome(6, true, END, None));
    assert_eq!(
        second.outcomes[1],
        outcome(6, false, END, Some(END)),
        "charged, reported over"
    );
    // Above its limit: still charged, never retries, never denies.
    let big = [shadow(&h.key("shadow"), calendar(END), 5, 6)];
    let third = h.eval(T0, &big, true).await;
    assert!(third.allowed);
    assert_eq!(third.outcomes[0], outcome(12, false, END, None));
}

async fn shadow_usage_saturates_at_2_pow_53_minus_1(h: &Harness) {
    for c in [
        shadow(&h.key("day"), calendar(END), MAX, MAX),
        shadow(&h.key("roll"), rolling(1_000, 10), MAX, MAX),
    ] {
        assert_eq!(h.one(T0, &c).await.used, MAX, "{}", c.key);
        let again = h.one(T0, &c).await;
        assert_eq!((again.used, again.allowed), (MAX, false), "{}", c.key);
    }
    // A token bucket saturates its state S = used × period_ms at 2^53 - 1 and clamps times.
    let tok = shadow(&h.key("tok"), token_bucket(1_000), 1, MAX);
    let saturated = MAX.div_ceil(1_000);
    assert_eq!(
        h.one(T0, &tok).await,
        outcome(saturated, false, MAX as i64, None)
    );
    assert_eq!(
        h.one(T0, &tok).await,
        outcome(saturated, false, MAX as i64, None)
    );
}

async fn a_peek_reports_the_charge_but_changes_nothing(h: &Harness) {
    let key = h.key("day");
    assert!(h.one(T0, &charge(&key, calendar(END), 5, 2)).await.allowed);
    let fits = charge(&key, calendar(END), 5, 3);
    assert_eq!(h.peek(T0, &fits).await, outcome(2, true, END, None));
    let too_much = charge(&key, calendar(END), 5, 4);
    assert_eq!(
        h.peek(T0, &too_much).await,
        outcome(2, false, END, Some(END))
    );
    assert_eq!(
        h.one(T0, &fits).await,
        outcome(5, true, END, None),
        "the peeks charged nothing"
    );
    let [day, roll, tok] = three(h, [1, 1, 1]);
    let untouched = [roll, tok];
    let evaluation = h.eval(T0, &untouched, false).await;
    assert!(evaluation.allowed);
    assert_eq!(evaluation.outcomes[0], outcome(0, true, T0, None));
    assert_eq!(evaluation.outcomes[1], outcome(0, true, T0, None));
    for c in &untouched {
        assert!(
            !h.exists(c.key.as_str(), T0).await,
            "a peek created {}",
            c.key
        );
    }
    assert_eq!(h.peek(T0, &day).await.used, 5);
}

async fn a_zero_cost_charge_creates_no_key(h: &Harness) {
    let evaluation = h.eval(T0, &three(h, [0, 0, 0]), true).await;
    assert!(evaluation.allowed);
    assert!(evaluation
        .outcomes
        .iter()
        .all(|o| *o == outcome(0, true, T0, None)));
    for c in three(h, [0, 0, 0]) {
        assert!(!h.exists(c.key.as_str(), T0).await, "{} was created", c.key);
    }
}

async fn a_limit_lowered_below_usage_denies_and_reports_the_usage(h: &Harness) {
    assert!(h.eval(T0, &three(h, [5, 5, 5]), true).await.allowed);
    let lowered = |cost| three(h, [cost, cost, cost]).map(|c| Charge { limit: 3, ..c });
    let evaluation = h.eval(T0, &lowered(1), true).await;
    assert!(!evaluation.allowed);
    let [day, roll, tok] = [0, 1, 2].map(|i| evaluation.outcomes[i]);
    assert_eq!(day, outcome(5, false, END, Some(END)));
    assert_eq!(roll, outcome(5, false, T0 + 11_000, Some(T0 + 11_000)));
    // S = 50_000 drains at 3 per ms; one unit fits at S <= 20_000, after 10 s.
    assert_eq!(tok, outcome(5, false, T0 + 16_667, Some(T0 + 10_000)));
    let looking = h.eval(T0, &lowered(0), false).await;
    assert!(
        looking.outcomes.iter().all(|o| o.used == 5 && !o.allowed),
        "{looking:?}"
    );
}

async fn every_charged_key_expires_once_its_usage_is_gone_plus_the_grace(h: &Harness) {
    let charges = three(h, [4, 4, 4]);
    assert!(h.eval(T0, &charges, true).await.allowed);
    // Calendar: the period's end; rolling: W + B; token bucket: 4 units drain in 4 s.
    for (c, lives) in charges.iter().zip([DAY, 11_000, 4_000]) {
        let expected = lives + KEY_GRACE_MS;
        let ttl = h.ttl_ms(c.key.as_str(), T0).await.unwrap_or(-2);
        assert!(
            ttl <= expected && ttl > expected - 5_000,
            "{}: TTL {ttl}, not {expected}",
            c.key
        );
    }
}

async fn malformed_decisions_are_rejected_before_touching_any_key(h: &Harness) {
    let a = charge(&h.key("a"), calendar(END), 10, 1);
    let other_tag = charge("ql-test:{another-subject}:a", calendar(END), 10, 1);
    let too_big = Charge {
        limit: MAX + 1,
        ..a.clone()
    };
    let overflowing = charge(&h.key("tok"), token_bucket(1_000), MAX / 999, 1);
    let no_buckets = charge(&h.key("roll"), rolling(1_000, 0), 10, 1);
    if !h.store.atomic_across_tags() {
        let error = h.eval_err(T0, &[a.clone(), other_tag]).await;
        assert!(
            matches!(error, StoreError::Protocol(_)),
            "two hash tags: {error}"
        );
    }
    for (what, charges) in [
        ("one key twice", vec![a.clone(), a.clone()]),
        ("a limit above 2^53 - 1", vec![too_big]),
        ("limit × period_ms above 2^53 - 1", vec![overflowing]),
        ("a window without buckets", vec![no_buckets]),
    ] {
        let error = h.eval_err(T0, &charges).await;
        assert!(matches!(error, StoreError::Protocol(_)), "{what}: {error}");
    }
    assert!(matches!(
        h.eval_err(1 << 52, std::slice::from_ref(&a)).await,
        StoreError::Protocol(_)
    ));
    assert!(!h.exists(a.key.as_str(), T0).await);
}

/// A store atomic across hash tags (memory, standalone Redis) decides charges of several
/// shards in one call: all charged or none (budgets shared by subjects).
async fn charges_of_several_hash_tags_are_all_or_none_where_the_store_allows_them(h: &Harness) {
    if !h.store.atomic_across_tags() {
        return;
    }
    let own = charge(&h.key("own"), calendar(END), 10, 1);
    let shared = charge(&h.other_tag_key("shared"), calendar(END), 2, 1);
    for expected in [true, true, false] {
        let evaluation = h.eval(T0, &[own.clone(), shared.clone()], true).await;
        assert_eq!(evaluation.allowed, expected);
    }
    let peek = h.eval(T0, &[own.clone(), shared.clone()], false).await;
    assert_eq!(peek.outcomes[0].used, 2, "the denial charged neither");
    assert_eq!(peek.outcomes[1].used, 2);
}

async fn an_empty_decision_is_allowed(h: &Harness) {
    let evaluation = h.eval(T0, &[], true).await;
    assert!(evaluation.allowed && evaluation.outcomes.is_empty());
}

async fn concurrent_decisions_never_allow_more_than_the_limit(h: &Harness) {
    let charges = [
        charge(&h.key("day"), calendar(END), 50, 1),
        charge(&h.key("roll"), rolling(1_000, 10), 50, 1),
    ];
    let mut attempts = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (store, charges) = (h.store.clone(), charges.clone());
        attempts.spawn(async move { store.evaluate(T0 + i, &charges, true).await });
    }
    let mut allowed = 0;
    while let Some(attempt) = attempts.join_next().await {
        allowed += u32::from(attempt.expect("joins").expect("evaluates").allowed);
    }
    assert_eq!(allowed, 50);
    let usage = h.eval(T0 + 200, &charges, false).await;
    assert_eq!(
        usage.outcomes.iter().map(|o| o.used).collect::<Vec<_>>(),
        [50, 50]
    );
}
