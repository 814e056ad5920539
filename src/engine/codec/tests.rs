//! Round trips of every record, and what malformed ones read as.

use super::row::{encode_policies, Detail};
use super::stream::decode_entry;
use super::*;
use crate::domain::{
    Action, Attributes, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, IdempotencyKey,
    KeptAnswer, LedgerEntry, Measure, Mode, PolicyAmount, PolicyId, Restore, Scope, Subject,
};
use chrono::{TimeZone, Utc};

/// A scope other than the default, so that round trips carry it.
fn org_scope() -> Scope {
    Scope::parse("scope", &["subject", "org"]).expect("a valid scope")
}

fn counter(restore: Restore) -> CounterCharge {
    CounterCharge {
        policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
        key: "t{5}k".to_owned(),
        restore,
        by_amount: true,
        charged: 40,
        scope: org_scope(),
    }
}

#[test]
fn several_entries_in_one_stream_entry_come_back_each_whole() {
    let first = hold_entry();
    let second = LedgerEntry {
        folded: Vec::new(),
        id: EntryId::new(),
        kind: EntryKind::Charge,
        hold_id: None,
        hold_expires_at: None,
        ..hold_entry()
    };
    let text = encode_entries(&[first.clone(), second.clone()]);
    assert_eq!(
        decode_entries(&text).expect("decodes"),
        vec![first.clone(), second]
    );
    assert_eq!(
        decode_entries(&encode_entry(&first)).expect("decodes"),
        vec![first],
        "one entry as before"
    );
}

fn hold_entry() -> LedgerEntry {
    LedgerEntry {
        folded: Vec::new(),
        id: EntryId::new(),
        at: Utc
            .with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
            .single()
            .expect("a valid instant"),
        kind: EntryKind::Hold,
        action: Action::parse("action", "transfer").expect("a valid action"),
        subject: Subject::parse("subject", "user \"42\" {x}|y").expect("a valid subject"),
        amount: 40,
        consumption_id: None,
        hold_id: Some(HoldId::new(9)),
        idempotency_key: Some(IdempotencyKey::parse("k-1").expect("a valid key")),
        policies: vec![PolicyAmount {
            policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
            amount: 40,
            scope: org_scope(),
        }],
        attributes: Attributes::parse(
            "attributes",
            [
                ("org".to_owned(), "acme, inc".to_owned()),
                ("tz".to_owned(), "Asia/Tokyo".to_owned()),
            ],
        )
        .expect("valid attributes"),
        counters: vec![
            counter(Restore::Calendar {
                period_end_ms: 86_400_000,
            }),
            counter(Restore::Rolling {
                bucket: 12,
                bucket_ms: 60_000,
                buckets: 60,
            }),
            counter(Restore::TokenBucket {
                period_ms: 1_000,
                limit: 5,
            }),
            counter(Restore::ZonedCalendar {
                period_end_ms: 86_400_000,
                charged_at_ms: 1_795_000_000_000,
            }),
            counter(Restore::Lifetime),
        ],
        hold_expires_at: Some(
            Utc.with_ymd_and_hms(2026, 11, 21, 12, 10, 0)
                .single()
                .expect("a valid instant"),
        ),
        kept_answer: Some(KeptAnswer {
            text: "{\"amount\":40}\n1,40,1,5,-1".to_owned(),
            expires_at_ms: 1_790_000_000_000,
        }),
        totals: Vec::new(),
    }
}

/// [`hold_entry`] with its counters alone as its detail, as entries without a hold
/// expiry or a kept answer are written.
fn charge_entry() -> LedgerEntry {
    LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Charge,
        hold_id: None,
        consumption_id: Some(ConsumptionId::new()),
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
        ..hold_entry()
    }
}

#[test]
fn every_record_reads_back_what_was_written() {
    let entry = hold_entry();
    assert_eq!(decode_entry(&encode_entry(&entry)), Ok(entry.clone()));
    let refund = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Refund,
        counters: Vec::new(),
        hold_id: None,
        consumption_id: Some(ConsumptionId::new()),
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
        ..entry.clone()
    };
    // As the stores keep it: the entry, then the refunded total.
    let kept = format!("{}\n40", encode_entry(&refund));
    assert_eq!(decode_refund_record(&kept), Ok(refund));
    assert_eq!(
        read_detail(&entry, encode_detail(&entry).as_deref()),
        Ok(Detail::of(&entry))
    );
    let charge = charge_entry();
    assert_eq!(decode_entry(&encode_entry(&charge)), Ok(charge.clone()));
    assert_eq!(
        read_detail(&charge, encode_detail(&charge).as_deref()),
        Ok(Detail::of(&charge))
    );
    let bare = LedgerEntry {
        folded: Vec::new(),
        counters: Vec::new(),
        ..charge
    };
    assert_eq!(encode_detail(&bare), None);
    assert_eq!(
        decode_policies(
            &encode_policies(&entry.policies, entry.amount),
            entry.amount
        ),
        Ok(entry.policies.clone())
    );
    let hold = HoldRecord {
        action: entry.action.clone(),
        subject: entry.subject.clone(),
        amount: 40,
        expires_at_ms: 1_234,
        counters: entry.counters.clone(),
        attributes: entry.attributes.clone(),
    };
    let kept = format!("open\n{}", encode_hold_record(&hold));
    assert_eq!(decode_hold_record(&kept), Ok(hold));
    let consume = ConsumeRecord {
        consumption_id: None,
        hold: entry.hold_id.map(|id| (id, 99)),
        amount: 40,
        at_ms: 7,
        policies: vec![KeptPolicy {
            policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
            measure: Measure::Amount,
            mode: Mode::Shadow,
            limit: 100,
            window_seconds: 86_400,
            scope: org_scope(),
            alert_thresholds: crate::domain::Thresholds::parse("t", &[50, 100]).expect("valid"),
        }],
        attributes: entry.attributes.clone(),
    };
    assert_eq!(
        decode_consume_record(&encode_consume_record(&consume)),
        Ok(consume)
    );
}

/// Reads `detail` back as the SQL ledger does, beside the other columns of `entry`.
fn read_detail(entry: &LedgerEntry, detail: Option<&str>) -> Result<Detail, CodecError> {
    let id = entry.id.to_string();
    let parts = EntryParts {
        id: &id,
        at: entry.at,
        kind: entry.kind.as_str(),
        action: entry.action.as_str(),
        subject: entry.subject.as_str(),
        amount: entry.amount,
        consumption_id: None,
        hold_id: None,
        idempotency_key: None,
    };
    decode_detail(detail, &parts, &entry.policies)
}

/// A charge of three budgets (the subject's, its country's, the action's), as the
/// benchmark's consumes write them.
pub(in crate::engine) fn three_budget_charge() -> LedgerEntry {
    let scopes = [
        Scope::default(),
        Scope::parse("scope", &["country"]).expect("a scope"),
        Scope::parse::<&str>("scope", &[]).expect("the global scope"),
    ];
    let ids = ["sms-user", "sms-country", "sms-global"];
    let keys = [
        "ql{0}3WpQuJy1xWRaS",
        "ql{h}vr35NHZ1xWRaS",
        "ql{V}fzeT3mC1xWRaS",
    ];
    let subject_key = |head: &str, i: usize| match i {
        0 => format!("{head}sms|u24399"),
        1 => format!("{head}sms|NG"),
        _ => format!("{head}sms|"),
    };
    let policies: Vec<PolicyAmount> = ids
        .iter()
        .zip(&scopes)
        .map(|(id, scope)| PolicyAmount {
            policy_id: PolicyId::parse("policy_id", id).expect("an id"),
            amount: 1,
            scope: scope.clone(),
        })
        .collect();
    LedgerEntry {
        folded: Vec::new(),
        action: Action::parse("action", "sms").expect("an action"),
        subject: Subject::parse("subject", "u24399").expect("a subject"),
        amount: 1,
        attributes: Attributes::parse("attributes", [("country".to_owned(), "NG".to_owned())])
            .expect("attributes"),
        counters: policies
            .iter()
            .enumerate()
            .map(|(i, p)| CounterCharge {
                policy_id: p.policy_id.clone(),
                key: subject_key(keys[i], i),
                restore: Restore::Calendar {
                    period_end_ms: 1_795_755_600_000,
                },
                by_amount: false,
                charged: 1,
                scope: p.scope.clone(),
            })
            .collect(),
        policies,
        ..charge_entry()
    }
}

#[test]
fn the_detail_column_is_compact_and_reads_back_with_its_row() {
    let charge = three_budget_charge();
    let compact = encode_detail(&charge).expect("a detail");
    assert_eq!(
        read_detail(&charge, Some(&compact)),
        Ok(Detail::of(&charge))
    );
    let hold = hold_entry();
    let detail = encode_detail(&hold);
    assert_eq!(read_detail(&hold, detail.as_deref()), Ok(Detail::of(&hold)));
    // A row's detail read beside another row's subject finds other counters: the keys
    // are relative to the row's own action and subject.
    let other = LedgerEntry {
        folded: Vec::new(),
        subject: Subject::parse("subject", "u1").expect("a subject"),
        ..charge.clone()
    };
    assert_ne!(read_detail(&other, Some(&compact)), Ok(Detail::of(&charge)));
    for bad in [
        "d1",
        "d1\u{1f}\u{1f}x",
        "d1\u{1f}9\u{1d}+k\u{1d}c1\u{1d}1\u{1d}",
    ] {
        assert!(read_detail(&charge, Some(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn the_policies_column_is_compact_and_reads_back_with_its_rows_amount() {
    let charge = three_budget_charge();
    let compact = encode_policies(&charge.policies, charge.amount);
    assert_eq!(
        decode_policies(&compact, charge.amount),
        Ok(charge.policies.clone())
    );
    // A policy's own amount, apart from the entry's, is kept as such; the others follow
    // the row's amount.
    let mut policies = charge.policies.clone();
    policies[0].amount = charge.amount + 5;
    let compact = encode_policies(&policies, charge.amount);
    assert_eq!(
        decode_policies(&compact, charge.amount),
        Ok(policies.clone())
    );
    let read = decode_policies(&compact, charge.amount + 1).expect("policies");
    assert_eq!(read[0].amount, charge.amount + 5);
    assert_eq!(read[1].amount, charge.amount + 1);
    assert_eq!(decode_policies(&encode_policies(&[], 3), 3), Ok(Vec::new()));
    for bad in [
        "p1",
        "p1\u{1f}p",
        "p1\u{1f}p\u{1d}x",
        "p1\u{1f}Bad Id\u{1d}",
    ] {
        assert!(decode_policies(bad, 1).is_err(), "{bad:?}");
    }
}

#[test]
fn a_single_policy_consume_waits_in_a_stream_entry_of_at_most_200_bytes() {
    let (action, subject) = ("payments.transfer", "customer-000123456");
    let policy_id = PolicyId::parse("policy_id", "transfers-rolling-24h").expect("an id");
    let entry = LedgerEntry {
        folded: Vec::new(),
        kind: EntryKind::Charge,
        action: Action::parse("action", action).expect("an action"),
        subject: Subject::parse("subject", subject).expect("a subject"),
        amount: 200_000,
        consumption_id: Some(ConsumptionId::new()),
        idempotency_key: Some(IdempotencyKey::parse("pay-2026-11-24-0001").expect("a key")),
        hold_id: None,
        hold_expires_at: None,
        kept_answer: None,
        totals: Vec::new(),
        policies: vec![PolicyAmount {
            policy_id: policy_id.clone(),
            amount: 200_000,
            scope: Scope::default(),
        }],
        attributes: Attributes::default(),
        counters: vec![CounterCharge {
            policy_id,
            // A rolling counter's key, as `crate::keys` lays it out.
            key: format!("ql:{{k}}AbCdEfG{action}|{subject}"),
            restore: Restore::Rolling {
                bucket: 29_544_000,
                bucket_ms: 60_000,
                buckets: 1_440,
            },
            by_amount: true,
            charged: 200_000,
            scope: Scope::default(),
        }],
        ..hold_entry()
    };
    let compact = encode_entry(&entry);
    assert!(compact.len() <= 200, "{} bytes: {compact:?}", compact.len());
    assert_eq!(decode_entry(&compact), Ok(entry));
}

#[test]
fn a_keyed_entry_carries_the_answer_kept_for_its_retries_in_compact_form() {
    let policies = vec![KeptPolicy {
        policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
        measure: Measure::Amount,
        mode: Mode::Shadow,
        limit: 100,
        window_seconds: 86_400,
        scope: org_scope(),
        // The compact form keeps them too (`,80/100`).
        alert_thresholds: crate::domain::Thresholds::parse("t", &[100, 80]).expect("valid"),
    }];
    for entry in [charge_entry(), hold_entry()] {
        let entry = LedgerEntry {
            folded: Vec::new(),
            kept_answer: None,
            totals: Vec::new(),
            ..entry
        };
        // What consume.lua appends: the evaluation's numbers.
        let (keeping, plain_len) = encode_entry_keeping(
            &entry,
            1_790_000_000_000,
            policies.iter().map(KeptPolicy::terms),
        );
        // What it appends instead when the answer need not be kept: the plain start.
        assert_eq!(keeping[..plain_len], encode_entry(&entry));
        let text = format!("{keeping}1,40,1,5,-1");
        let decoded = decode_entry(&text).expect("reads back");
        let kept = decoded.kept_answer.clone().expect("a kept answer");
        assert_eq!(kept.expires_at_ms, 1_790_000_000_000);
        let (record, numbers) = kept.text.split_once('\n').expect("record, numbers");
        assert_eq!(numbers, "1,40,1,5,-1");
        let at_ms = entry.at.timestamp_millis();
        let expected = ConsumeRecord::of_entry(&entry, at_ms, policies.clone());
        assert_eq!(decode_consume_record(record), Ok(expected));
        assert_eq!(
            LedgerEntry {
                folded: Vec::new(),
                kept_answer: None,
                totals: Vec::new(),
                ..decoded
            },
            entry
        );
    }
}

#[test]
fn a_counter_of_an_unknown_kind_is_an_error_not_a_calendar_counter() {
    let hold = |counter: &str| {
        format!(
            r#"open
{{"action":"a","subject":"s","amount":1,"expires_at_ms":5,"counters":[{counter}]}}"#
        )
    };
    let calendar = r#"{"policy_id":"p","key":"k","kind":1,"by_amount":true,"charged":1}"#;
    assert!(decode_hold_record(&hold(calendar)).is_ok());
    let lifetime = r#"{"policy_id":"p","key":"k","kind":5,"by_amount":true,"charged":1}"#;
    let counters = decode_hold_record(&hold(lifetime))
        .expect("a lifetime counter")
        .counters;
    assert_eq!(counters[0].restore, Restore::Lifetime);
    let unknown = r#"{"policy_id":"p","key":"k","kind":9,"by_amount":true,"charged":1}"#;
    assert!(decode_hold_record(&hold(unknown)).is_err());
    let rolling_without_buckets =
        r#"{"policy_id":"p","key":"k","kind":2,"span_ms":1000,"by_amount":true,"charged":1}"#;
    assert!(decode_hold_record(&hold(rolling_without_buckets)).is_err());
}

#[test]
fn malformed_records_are_errors() {
    for text in ["", "open", "open\n{", "open\n{}"] {
        assert!(decode_hold_record(text).is_err(), "{text:?}");
    }
    let entry = encode_entry(&hold_entry());
    let hold_id = entry.split('\u{1f}').nth(8).expect("field 8").to_owned();
    let (id, _shard) = hold_id.split_once('.').expect("<id>.<shard>");
    let without_shard = entry.replace(&hold_id, id);
    assert!(
        decode_entry(&without_shard).is_err(),
        "a hold id must be <id>.<shard>"
    );
    assert!(
        decode_entry(&format!("{{{}", &entry[1..])).is_err(),
        "JSON, or any other version, is not read"
    );
    assert!(decode_replay("{}").is_err(), "no numbers");
    assert!(decode_replay("{}\n1,x").is_err(), "numbers that are not");
}

/// An entry that adds to the ledger's totals streams in version 4, its lines after the
/// attributes; with a hold's expiry and an answer kept after them, each reads back whole.
#[test]
fn an_entry_with_totals_reads_back_with_its_lines() {
    let line = |budget: &str, amount: i64, allowed: i64, denied: i64| crate::domain::TotalLine {
        policy_id: PolicyId::parse("policy_id", "p").expect("a valid id"),
        budget: budget.to_owned(),
        period_end: Utc
            .with_ymd_and_hms(2026, 11, 22, 0, 0, 0)
            .single()
            .expect("a valid instant"),
        amount,
        allowed,
        denied,
    };
    let totals = vec![
        line("u-1,acme", 40, 1, 0),
        line("*", -40, -1, 0),
        line("x", 0, 0, 1),
    ];
    for entry in [charge_entry(), hold_entry()] {
        let entry = LedgerEntry {
            folded: Vec::new(),
            totals: totals.clone(),
            ..entry
        };
        let text = encode_entry(&entry);
        assert!(text.starts_with("4\u{1f}"), "{text:?}");
        assert_eq!(decode_entry(&text), Ok(entry.clone()));
    }
    let plain = encode_entry(&charge_entry());
    assert!(
        plain.starts_with("3\u{1f}"),
        "no totals, the version before: {plain:?}"
    );
    let with = encode_entry(&LedgerEntry {
        folded: Vec::new(),
        totals,
        ..charge_entry()
    });
    let broken = with.replacen("\u{1d}-40\u{1d}", "\u{1d}forty\u{1d}", 1);
    assert!(decode_entry(&broken).is_err(), "{broken:?}");

    // The SQL ledger's `totals` column reads back the lines it holds.
    let column = super::totals_column(&with_totals_lines(&with));
    assert_eq!(
        super::totals_from_column(column.clone()),
        Ok(with_totals_lines(&with))
    );
    assert_eq!(super::totals_from_column(None), Ok(Vec::new()));
    let mut bad = column.expect("a column for lines");
    bad[0]["allowed"] = serde_json::json!("one");
    assert!(super::totals_from_column(Some(bad)).is_err());
}

/// The lines of the entry whose compact form is `text`.
fn with_totals_lines(text: &str) -> Vec<crate::domain::TotalLine> {
    decode_entry(text).expect("a valid entry").totals
}
