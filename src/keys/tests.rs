//! The key layout's tests: injective, one hash tag per subject, short.

use super::*;
use crate::domain::{CalendarPeriod, Measure, PolicyId, PolicySpec, Window, MAX_SAFE};
use chrono::DateTime;

fn keys_of(action: &str, subject: &str) -> SubjectKeys {
    let action = Action::parse("action", action).expect("valid");
    SubjectKeys::new("ql", &action, &Subject::parse("s", subject).expect("valid"))
}

fn policy(id: &str, measure: Measure, window: Window, limit: u64) -> Policy {
    Policy {
        id: PolicyId::parse("id", id).expect("valid"),
        spec: PolicySpec::example("sms", measure, limit, window),
        created_at: DateTime::UNIX_EPOCH,
        updated_at: DateTime::UNIX_EPOCH,
        version: 1,
    }
}

fn day_in(timezone: &str) -> Window {
    Window::calendar(CalendarPeriod::Day, timezone).expect("valid")
}

#[test]
fn the_hash_tag_is_the_shard_whatever_the_subject_contains() {
    let pk = PolicyKey(*b"abcdefg");
    for subject in ["user-42", "{evil}", "a}b{c", "50%", "x:y|z", "Zoë ünïcode"] {
        let keys = keys_of("sms.send", subject);
        let counter = keys.counter(&pk, Some(1_795_237_200));
        assert_eq!(counter.shard(), keys.shard, "the key knows its shard");
        let key = counter.as_str();
        let open = key.find('{').expect("has a tag");
        let close = key[open..].find('}').expect("tag closes") + open;
        assert_eq!(close, open + 2, "a one-character tag: {key}");
        assert_eq!(key[..close + 1], shard_prefix("ql", keys.shard), "{key}");
    }
}

#[test]
fn different_subjects_actions_periods_and_policies_never_share_a_key() {
    let pks = [PolicyKey(*b"abcdefg"), PolicyKey(*b"abcdefh")];
    let mut seen = std::collections::HashSet::new();
    let mut count = 0;
    for (action, subject) in [
        ("a", "b|c"),
        ("a", "b"),
        ("a.b", "c"),
        ("ab", "c"),
        ("a", "bc"),
    ] {
        let keys = keys_of(action, subject);
        for pk in &pks {
            for period in [None, Some(0), Some(61), Some(62), Some(1_795_237_200)] {
                seen.insert(keys.counter(pk, period).as_str().to_owned());
                count += 1;
            }
        }
        for idem in ["k", "k1", "1:k"] {
            seen.insert(keys.idempotency('c', idem));
            count += 1;
        }
    }
    assert_eq!(seen.len(), count);
}

#[test]
fn shards_spread_subjects_evenly_enough() {
    let mut counts = [0u32; SHARDS as usize];
    for i in 0..64_000 {
        counts[shard("sms.send", &format!("user-{i}")) as usize] += 1;
    }
    let (min, max) = (counts.iter().min(), counts.iter().max());
    assert!(min > Some(&800) && max < Some(&1200), "{min:?}..{max:?}");
}

#[test]
fn a_policy_key_never_changes_for_an_unchanged_policy() {
    // These digits name live counters in Redis: a change here resets every quota.
    let daily = policy("sms-per-day", Measure::Count, day_in("UTC"), 10);
    assert_eq!(policy_key(&daily).as_str(), "3Cp9NPI");
    let rolling = Window::rolling(86_400, 3_600).expect("valid");
    let usd = policy("transfer-usd-24h", Measure::Amount, rolling, 200_000);
    assert_eq!(policy_key(&usd).as_str(), "MVxSPdL");
}

#[test]
fn the_policy_key_follows_id_measure_and_window_but_not_the_limit() {
    let base = policy("sms-per-day", Measure::Count, day_in("UTC"), 10);
    let key = policy_key(&base);
    assert_eq!(key.as_str().len(), POLICY_KEY_LEN);
    let higher = policy("sms-per-day", Measure::Count, day_in("UTC"), MAX_SAFE);
    assert_eq!(policy_key(&higher), key, "raising the limit keeps usage");
    let changed = [
        policy("sms-per-day-2", Measure::Count, day_in("UTC"), 10),
        policy("sms-per-day", Measure::Amount, day_in("UTC"), 10),
        policy("sms-per-day", Measure::Count, day_in("Europe/Berlin"), 10),
        policy(
            "sms-per-day",
            Measure::Count,
            Window::token_bucket(86_400).expect("valid"),
            10,
        ),
    ];
    let mut keys: std::collections::HashSet<PolicyKey> = changed.iter().map(policy_key).collect();
    keys.insert(key);
    assert_eq!(keys.len(), changed.len() + 1, "each change starts afresh");
}

#[test]
fn a_calendar_key_of_a_short_action_and_subject_fits_in_28_bytes() {
    // Redis keeps such a name in a 32-byte allocation (see the module documentation).
    let daily = policy_key(&policy("sms-per-day", Measure::Count, day_in("UTC"), 10));
    let key = keys_of("sms", "u12345").counter(&daily, Some(1_795_237_200));
    assert_eq!(key.as_str().len(), 28, "{key}");
}
