//! Calendar periods: one counter per period, reset by moving to the next period's key.

use super::{calendar, charge, outcome, Harness, DAY, T0};
use crate::engine::store::Charge;

scenarios!(
    a_calendar_counter_allows_up_to_the_limit_then_denies_until_the_period_ends,
    a_calendar_charge_reaching_the_limit_exactly_is_allowed,
    a_calendar_counter_starts_afresh_with_the_next_periods_key,
    a_calendar_charge_above_the_limit_is_denied_with_no_retry_time,
    a_decision_of_more_charges_than_luas_stack_holds_applies_each_of_them,
);

/// The end of the period that starts at T0.
const END: i64 = T0 + DAY;

async fn a_calendar_counter_allows_up_to_the_limit_then_denies_until_the_period_ends(h: &Harness) {
    let sms = charge(&h.key("sms:day0"), calendar(END), 3, 1);
    assert_eq!(
        h.peek(T0, &sms).await,
        outcome(0, true, T0, None),
        "nothing used yet"
    );
    assert_eq!(h.one(T0, &sms).await, outcome(1, true, END, None));
    assert_eq!(h.one(T0 + 1, &sms).await, outcome(2, true, END, None));
    assert_eq!(h.one(T0 + 2, &sms).await, outcome(3, true, END, None));
    assert_eq!(h.one(T0 + 3, &sms).await, outcome(3, false, END, Some(END)));
    assert_eq!(
        h.one(END - 1, &sms).await,
        outcome(3, false, END, Some(END))
    );
}

async fn a_calendar_charge_reaching_the_limit_exactly_is_allowed(h: &Harness) {
    let key = h.key("transfer:day0");
    let ten = charge(&key, calendar(END), 10, 10);
    assert_eq!(h.one(T0, &ten).await, outcome(10, true, END, None));
    let one = charge(&key, calendar(END), 10, 1);
    assert_eq!(h.one(T0, &one).await, outcome(10, false, END, Some(END)));
    let nothing = charge(&key, calendar(END), 10, 0);
    assert_eq!(
        h.one(T0, &nothing).await,
        outcome(10, true, END, None),
        "0 more still fits"
    );
}

async fn a_calendar_counter_starts_afresh_with_the_next_periods_key(h: &Harness) {
    let today = charge(&h.key("sms:day0"), calendar(END), 2, 2);
    assert_eq!(h.one(T0, &today).await, outcome(2, true, END, None));
    assert_eq!(
        h.one(END - 1, &today).await,
        outcome(2, false, END, Some(END))
    );
    let tomorrow = charge(&h.key("sms:day1"), calendar(END + DAY), 2, 2);
    assert_eq!(
        h.one(END, &tomorrow).await,
        outcome(2, true, END + DAY, None)
    );
    assert_eq!(
        h.peek(END - 1, &today).await.used,
        2,
        "the old period keeps its own count"
    );
}

async fn a_calendar_charge_above_the_limit_is_denied_with_no_retry_time(h: &Harness) {
    let big = charge(&h.key("transfer:day0"), calendar(END), 10, 11);
    assert_eq!(h.one(T0, &big).await, outcome(0, false, T0, None));
    assert!(
        !h.exists(big.key.as_str(), T0).await,
        "a denied charge writes nothing"
    );
}

/// Requests decided together make one call of many charges (up to 32 descriptors of up to
/// 32 policies each). consume.lua makes its tables at their final size with `unpack`, which
/// Lua's stack bounds (8,000 slots, 6 per charge): a call of more charges must still work.
async fn a_decision_of_more_charges_than_luas_stack_holds_applies_each_of_them(h: &Harness) {
    let charges: Vec<Charge> = (0..1_400)
        .map(|i| charge(&h.key(&format!("sms:{i}")), calendar(END), 2, 1))
        .collect();
    for used in 1..=2 {
        let evaluation = h.eval(T0 + used, &charges, true).await;
        assert!(evaluation.allowed, "charge {used}");
        assert_eq!(evaluation.outcomes.len(), charges.len());
        for (i, o) in evaluation.outcomes.iter().enumerate() {
            assert_eq!(
                *o,
                outcome(used as u64, true, END, None),
                "charge {used}, counter {i}"
            );
        }
    }
    let third = h.eval(T0 + 3, &charges, true).await;
    assert!(!third.allowed);
    assert!(third
        .outcomes
        .iter()
        .all(|o| *o == outcome(2, false, END, Some(END))));
    // The second charge kept the period's TTL the first one set.
    for c in [&charges[0], &charges[1_399]] {
        let ttl = h.ttl_ms(c.key.as_str(), T0 + 3).await;
        assert!(ttl.is_some_and(|ttl| ttl > END - T0), "{}: {ttl:?}", c.key);
    }
}
