//! What a decision does besides counting, in the same atomic step, on every store: a kept
//! answer replayed to a retry, a hold opened, indexed by its expiry and given back once, a
//! keyed refund replayed; nothing of it when the decision is denied.

use super::giveback::counter;
use super::{calendar, charge, Harness, DAY, T0};
use crate::domain::Restore;
use crate::engine::store::{
    Charge, Consume, Decided, Effects, GiveBack, GiveBackKind, GivenBack, HoldOpen,
    IdempotencyRecord,
};

scenarios!(
    a_keyed_retry_replays_the_first_answer_and_charges_once,
    a_hold_keeps_its_record_and_falls_due_at_its_expiry,
    a_hold_is_settled_once_and_keeps_what_it_settles,
    a_denied_decision_keeps_no_answer_and_opens_no_hold,
    a_keyed_refund_is_given_once_and_replayed
);

const END: i64 = T0 + DAY;
const EXPIRES: i64 = T0 + 60_000;

/// A calendar charge of `cost` on the counter `name`, limit 10.
fn spend(h: &Harness, cost: u64) -> Charge {
    charge(&h.key("spent"), calendar(END), 10, cost)
}

/// An answer kept under the key `name` (never in flight: the store keeps it at once).
fn kept(h: &Harness, name: &str) -> IdempotencyRecord {
    IdempotencyRecord {
        key: h.key(name),
        ttl_ms: DAY,
        record: format!("answer of {name}"),
        pending: false,
    }
}

/// A hold `id` of the shard's index, expiring at [`EXPIRES`].
fn hold(h: &Harness, id: &str) -> HoldOpen {
    HoldOpen {
        record_key: h.key(&format!("hold:{id}")),
        index_key: h.key("holds"),
        hold_id: id.to_owned(),
        expires_at_ms: EXPIRES,
        record: format!("how to give {id} back"),
        ttl_ms: DAY,
    }
}

/// Decides `charges` with `effects` at `now_ms`, committing.
async fn decide(h: &Harness, now_ms: i64, charges: &[Charge], effects: &Effects) -> Decided {
    let call = Consume {
        now_ms,
        charges,
        commit: true,
        effects,
    };
    h.store.decide(&call).await.expect("a decision")
}

/// The usage of the counter `spent` now.
async fn spent(h: &Harness, now_ms: i64) -> u64 {
    h.peek(now_ms, &spend(h, 0)).await.used
}

async fn a_keyed_retry_replays_the_first_answer_and_charges_once(h: &Harness) {
    let effects = Effects {
        idempotency: Some(kept(h, "idem")),
        ..Effects::default()
    };
    let Decided::Fresh(first) = decide(h, T0, &[spend(h, 4)], &effects).await else {
        panic!("the first decision is fresh");
    };
    assert!(first.allowed);
    let again = decide(h, T0 + 1_000, &[spend(h, 4)], &effects).await;
    let Decided::Replayed { record, evaluation } = again else {
        panic!("a retry is replayed, got {again:?}");
    };
    assert_eq!(record, "answer of idem");
    assert_eq!(evaluation, first, "the retry gets the first answer");
    assert_eq!(spent(h, T0 + 1_000).await, 4, "charged once");
}

async fn a_hold_keeps_its_record_and_falls_due_at_its_expiry(h: &Harness) {
    let open = hold(h, "h1");
    let effects = Effects {
        hold: Some(open.clone()),
        ..Effects::default()
    };
    assert!(matches!(
        decide(h, T0, &[spend(h, 5)], &effects).await,
        Decided::Fresh(evaluation) if evaluation.allowed
    ));
    let record = h.store.record(&open.record_key, T0).await.expect("read");
    assert_eq!(record.as_deref(), Some("open\nhow to give h1 back"));
    let index = open.index_key.as_str();
    assert_eq!(h.store.next_due(index).await.expect("read"), Some(EXPIRES));
    let due = |at| h.store.expired_holds(index, at, 10);
    assert!(due(EXPIRES - 1).await.expect("read").is_empty());
    assert_eq!(due(EXPIRES).await.expect("read"), ["h1"]);
}

async fn a_hold_is_settled_once_and_keeps_what_it_settles(h: &Harness) {
    let open = hold(h, "h2");
    let effects = Effects {
        hold: Some(open.clone()),
        ..Effects::default()
    };
    decide(h, T0, &[spend(h, 5)], &effects).await;
    let settle = GiveBack {
        kind: GiveBackKind::Commit {
            settle: 3,
            total: 5,
            expires_at_ms: EXPIRES,
        },
        control_key: open.record_key.clone(),
        hold_index: Some((open.index_key.clone(), open.hold_id.clone())),
        counters: vec![counter(
            &h.key("spent"),
            Restore::Calendar { period_end_ms: END },
            true,
            5,
        )],
        ledger: None,
        idempotency: None,
        pending: None,
        reports_usage: false,
    };
    let given = h.store.give_back(T0 + 1_000, &settle).await.expect("given");
    assert!(matches!(given, GivenBack::Done { .. }), "{given:?}");
    assert_eq!(
        spent(h, T0 + 1_000).await,
        3,
        "what is settled stays charged"
    );
    let again = h
        .store
        .give_back(T0 + 2_000, &settle)
        .await
        .expect("an answer");
    assert!(matches!(again, GivenBack::Conflict(_)), "{again:?}");
    assert_eq!(spent(h, T0 + 2_000).await, 3, "given back once");
    let due = h.store.expired_holds(&open.index_key, EXPIRES, 10).await;
    assert!(
        due.expect("read").is_empty(),
        "a settled hold never falls due"
    );
}

async fn a_denied_decision_keeps_no_answer_and_opens_no_hold(h: &Harness) {
    let open = hold(h, "h3");
    let effects = Effects {
        idempotency: Some(kept(h, "denied")),
        hold: Some(open.clone()),
        ..Effects::default()
    };
    let denied = decide(h, T0, &[spend(h, 11)], &effects).await;
    assert!(
        matches!(&denied, Decided::Fresh(e) if !e.allowed),
        "{denied:?}"
    );
    assert_eq!(
        h.store.record(&open.record_key, T0).await.expect("read"),
        None
    );
    assert_eq!(h.store.next_due(&open.index_key).await.expect("read"), None);
    let retry = decide(h, T0, &[spend(h, 1)], &effects).await;
    assert!(
        matches!(&retry, Decided::Fresh(e) if e.allowed),
        "a denial keeps no answer to replay: {retry:?}"
    );
}

async fn a_keyed_refund_is_given_once_and_replayed(h: &Harness) {
    decide(h, T0, &[spend(h, 6)], &Effects::default()).await;
    let refund = GiveBack {
        kind: GiveBackKind::Refund {
            amount: 2,
            total: 6,
            refunded: 0,
        },
        control_key: h.key("refunded"),
        hold_index: None,
        counters: vec![counter(
            &h.key("spent"),
            Restore::Calendar { period_end_ms: END },
            true,
            6,
        )],
        ledger: None,
        idempotency: Some(kept(h, "refund-key")),
        pending: None,
        reports_usage: false,
    };
    let given = h.store.give_back(T0 + 1_000, &refund).await.expect("given");
    assert!(
        matches!(given, GivenBack::Done { refunded: 2, .. }),
        "{given:?}"
    );
    let again = h
        .store
        .give_back(T0 + 2_000, &refund)
        .await
        .expect("an answer");
    assert!(matches!(again, GivenBack::Replayed(_)), "{again:?}");
    assert_eq!(spent(h, T0 + 2_000).await, 4, "refunded once");
}
