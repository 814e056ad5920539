//! Per-request maximums: a charge passes when its cost is at most the limit; nothing is
//! read, written or accumulated.

use super::{calendar, charge, outcome, Harness, DAY, T0};
use crate::engine::store::Algorithm;

scenarios!(
    a_per_request_maximum_passes_at_and_below_its_limit_and_denies_above_it,
    a_per_request_maximum_accumulates_nothing_and_writes_no_key,
    a_per_request_maximum_above_its_limit_denies_the_whole_decision,
);

async fn a_per_request_maximum_passes_at_and_below_its_limit_and_denies_above_it(h: &Harness) {
    let key = h.key("card:per-auth");
    for (cost, allowed) in [(0, true), (499, true), (500, true), (501, false)] {
        let request = charge(&key, Algorithm::Request, 500, cost);
        assert_eq!(
            h.one(T0, &request).await,
            outcome(cost, allowed, T0, None),
            "{cost} against a maximum of 500: no retry time, it never passes later"
        );
    }
}

async fn a_per_request_maximum_accumulates_nothing_and_writes_no_key(h: &Harness) {
    let key = h.key("card:per-auth");
    let request = charge(&key, Algorithm::Request, 500, 500);
    for at in [T0, T0 + 1, T0 + 2] {
        assert_eq!(h.one(at, &request).await, outcome(500, true, at, None));
    }
    assert_eq!(
        h.peek(T0 + 3, &charge(&key, Algorithm::Request, 500, 0))
            .await
            .used,
        0
    );
    assert!(!h.exists(&key, T0 + 3).await, "nothing was written");
}

async fn a_per_request_maximum_above_its_limit_denies_the_whole_decision(h: &Harness) {
    let daily = charge(&h.key("card:day0"), calendar(T0 + DAY), 2_000, 600);
    let per_auth = charge(&h.key("card:per-auth"), Algorithm::Request, 500, 600);
    let evaluation = h.eval(T0, &[daily.clone(), per_auth], true).await;
    assert!(!evaluation.allowed, "{evaluation:?}");
    assert_eq!(
        evaluation.outcomes[0],
        outcome(0, true, T0, None),
        "the day charged nothing"
    );
    let again = h.one(T0, &daily).await;
    assert_eq!(
        again.used, 600,
        "only the allowed charge afterwards: {again:?}"
    );
}
