//! The compact form of a ledger entry: what the Redis streams hold while the entry waits
//! for the drain, and what a refund's idempotency record keeps.
//!
//! A Postgres outage makes every allowed consume wait in Redis memory as one stream entry,
//! so its size is the outage budget (docs/operations.md, "Outage budget"): a single-policy consume
//! takes well under 200 bytes here, against about 550 as JSON. No JSON inside, no field
//! names, ids as 22 characters of base 64, and the counter's key without the action and
//! subject that the entry already names.
//!
//! The text is fields separated by `US` (0x1f); lists separate their items by `RS` (0x1e)
//! and an item's parts by `GS` (0x1d). Actions, subjects, policy ids and idempotency keys
//! never contain control characters (the domain types refuse them), so no escaping is
//! needed; the kept answer, which may contain a newline, is the last field and takes the
//! rest of the text.
//!
//! | # | field | form |
//! |---|---|---|
//! | 0 | version | `3`; `4` for an entry that adds to the ledger's totals |
//! | 1 | id | `b64` |
//! | 2 | at | Unix ms |
//! | 3 | kind | one letter: `c`harge, `r`efund, `h`old, co`m`mit, re`l`ease, e`x`pire, `d`eny, `v`oid |
//! | 4, 5 | action, subject | as is |
//! | 6 | amount | decimal |
//! | 7 | consumption id | `b64`, or empty |
//! | 8 | hold id | `b64` `.` shard, or empty |
//! | 9 | idempotency key | as is, or empty |
//! | 10 | policies | per policy: id `GS` amount (empty: the entry's amount), then `GS` and its scope's key names joined by `,` unless it is the default scope |
//! | 11 | counters | per counter: policy `GS` key `GS` restore `GS` by-amount (`1`/`0`) `GS` charged (empty: its policy's amount) |
//! | 12 | attributes | per attribute: key `GS` value |
//! | (version 4) | totals | per line: policy `GS` budget `GS` period end (Unix ms) `GS` amount `GS` allowed `GS` denied; the fields after it keep their order |
//! | 13 | a hold's expiry | Unix ms (optional) |
//! | 14, 15 | a kept answer | its expiry (Unix ms), then its text, or its compact form (optional) |
//!
//! A kept answer's **compact form** is what a keyed consume's stream entry carries, so that
//! a Redis that lost its data gets the answer back from the ledger: per policy (in field 10's
//! order) its measure (`c`ount, `a`mount), mode (`e`nforce, `s`hadow), limit and window
//! seconds, as `ae,200000,86400`, separated by `;`; then `\n` and the evaluation's numbers,
//! which `consume.lua` appends. The rest of the idempotency record (ids, amount, instant)
//! is the entry's own. A full text starts with `{` (the record's JSON).
//!
//! A counter's policy is the index of its policy in field 10 (empty: the counter's own
//! position), whose scope is the counter's, or `~` and the id (`~` is no slug character;
//! the default scope). Its key is `+` and the part before `<action>|<subject>` when it ends so
//! (it always does, `crate::keys`), or `=` and the whole key. Its restore is `c<period
//! end ms>`, `r<bucket>,<bucket ms>,<buckets>` (the bucket empty when it is the one the
//! entry's instant falls in), `t<period ms>,<limit>` or `z<period end ms>` (a zoned calendar,
//! charged at the entry's instant) or `z<period end ms>,<charged at ms>`.

use super::fields::{
    decode_attributes, decode_counters, decode_expiry_and_kept, decode_hold_id, decode_policies,
    from_b64, instant, number, optional, push_b64, push_int, write_counters, write_expiry_and_kept,
    write_policies, KeySuffix, GS, RS, US, WHAT,
};
use super::replay::{encode_consume_record, ConsumeRecord, KeptPolicy, KeptTerms};
use super::row::EntryParts;
use super::CodecError;
use crate::domain::{
    ConsumptionId, EntryId, EntryKind, LedgerEntry, Measure, Mode, PolicyId, TotalLine,
};
use std::fmt::Write as _;

/// The first field of an entry's compact form.
const VERSION: &str = "3";

/// The first field of the compact form of an entry that adds to the ledger's totals: it
/// has one more field after the attributes, its totals (see the module doc).
const VERSION_TOTALS: &str = "4";

/// The kinds' letters, in [`EntryKind::ALL`] order.
const KIND_LETTERS: [char; 8] = ['c', 'r', 'h', 'm', 'l', 'x', 'd', 'v'];

fn kind_letter(kind: EntryKind) -> char {
    let index = EntryKind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
    KIND_LETTERS[index]
}

/// The compact form of `entry`.
pub(super) fn encode(entry: &LedgerEntry) -> String {
    let mut out = String::with_capacity(160);
    let at_ms = entry.at.timestamp_millis();
    out.push_str(match entry.totals.is_empty() {
        true => VERSION,
        false => VERSION_TOTALS,
    });
    out.push(US);
    push_b64(&mut out, entry.id.to_bits());
    out.push(US);
    push_int(&mut out, at_ms);
    out.push(US);
    out.push(kind_letter(entry.kind));
    out.push(US);
    out.push_str(entry.action.as_str());
    out.push(US);
    out.push_str(entry.subject.as_str());
    out.push(US);
    push_int(&mut out, entry.amount);
    out.push(US);
    if let Some(id) = entry.consumption_id {
        push_b64(&mut out, id.to_bits());
    }
    out.push(US);
    if let Some(id) = entry.hold_id {
        push_b64(&mut out, id.uuid_bits());
        out.push('.');
        push_int(&mut out, id.shard());
    }
    out.push(US);
    if let Some(key) = &entry.idempotency_key {
        out.push_str(key.as_str());
    }
    out.push(US);
    write_policies(&mut out, &entry.policies, entry.amount);
    out.push(US);
    let suffix = KeySuffix {
        action: entry.action.as_str(),
        subject: entry.subject.as_str(),
    };
    write_counters(&mut out, entry, suffix, at_ms);
    out.push(US);
    for (i, (key, value)) in entry.attributes.iter().enumerate() {
        if i > 0 {
            out.push(RS);
        }
        out.push_str(key);
        out.push(GS);
        out.push_str(value);
    }
    if !entry.totals.is_empty() {
        out.push(US);
        for (i, line) in entry.totals.iter().enumerate() {
            if i > 0 {
                out.push(RS);
            }
            out.push_str(line.policy_id.as_str());
            out.push(GS);
            out.push_str(&line.budget);
            let end_ms = line.period_end.timestamp_millis();
            for n in [end_ms, line.amount, line.allowed, line.denied] {
                out.push(GS);
                push_int(&mut out, n);
            }
        }
    }
    write_expiry_and_kept(&mut out, entry);
    out
}

/// Reads the totals field of a version 4 entry: lines separated by `RS`, each its policy,
/// budget, period end (Unix ms), amount, requests allowed and requests denied, separated
/// by `GS`.
fn decode_totals(text: &str) -> Result<Vec<TotalLine>, CodecError> {
    text.split(RS)
        .filter(|line| !line.is_empty())
        .map(|line| {
            let parts: Vec<&str> = line.split(GS).collect();
            let [policy, budget, end, amount, allowed, denied] = parts[..] else {
                return Err(CodecError::new(WHAT, format!("totals line '{line}'")));
            };
            Ok(TotalLine {
                policy_id: PolicyId::parse("policy", policy)
                    .map_err(|e| CodecError::new(WHAT, e.message))?,
                budget: budget.to_owned(),
                period_end: instant(number("period end", end)?)?,
                amount: number("total amount", amount)?,
                allowed: number("requests allowed", allowed)?,
                denied: number("requests denied", denied)?,
            })
        })
        .collect()
}

/// The compact form of `entry` (a charge or hold whose answer is kept until
/// `kept_until_ms`), ending where the store appends the evaluation's numbers.
/// Also the length of the entry's own compact form (without a kept answer) at its start.
pub(super) fn encode_keeping<'a>(
    entry: &LedgerEntry,
    kept_until_ms: i64,
    policies: impl IntoIterator<Item = KeptTerms<'a>>,
) -> (String, usize) {
    // The plain form ends with the hold's expiry, if any: the kept answer follows it.
    let mut out = match entry.kept_answer {
        None => encode(entry),
        Some(_) => encode(&LedgerEntry {
            folded: Vec::new(),
            kept_answer: None,
            ..entry.clone()
        }),
    };
    let plain_len = out.len();
    if entry.hold_expires_at.is_none() {
        out.push(US);
    }
    let _ = write!(out, "{US}{kept_until_ms}{US}");
    for (i, p) in policies.into_iter().enumerate() {
        let measure = if p.measure == Measure::Amount {
            'a'
        } else {
            'c'
        };
        let mode = if p.mode == Mode::Shadow { 's' } else { 'e' };
        let semicolon = if i > 0 { ";" } else { "" };
        let _ = write!(
            out,
            "{semicolon}{measure}{mode},{},{}",
            p.limit, p.window_seconds
        );
        // Alert thresholds, when it has any: `,50/80/100`.
        for (j, percent) in p.thresholds.iter().enumerate() {
            let separator = if j == 0 { ',' } else { '/' };
            let _ = write!(out, "{separator}{percent}");
        }
    }
    out.push('\n');
    (out, plain_len)
}

/// The full text of a kept answer given in compact form (see the module doc).
fn kept_text(compact: &str, entry: &LedgerEntry) -> Result<String, CodecError> {
    let (policies, numbers) = compact
        .split_once('\n')
        .ok_or_else(|| CodecError::new(WHAT, "a kept answer without its numbers"))?;
    let kinds: Vec<&str> = policies.split(';').filter(|p| !p.is_empty()).collect();
    if kinds.len() != entry.policies.len() {
        return Err(CodecError::new(WHAT, "a kept answer for other policies"));
    }
    let policies = kinds
        .iter()
        .zip(&entry.policies)
        .map(|(kind, policy)| {
            let parts: Vec<&str> = kind.split(',').collect();
            let (flags, limit, window, alerts) = match parts[..] {
                [flags, limit, window] => (flags, limit, window, ""),
                [flags, limit, window, alerts] => (flags, limit, window, alerts),
                _ => return Err(CodecError::new(WHAT, format!("kept policy '{kind}'"))),
            };
            let alerts = alerts
                .split('/')
                .filter(|p| !p.is_empty())
                .map(|p| number("kept threshold", p))
                .collect::<Result<Vec<u8>, CodecError>>()?;
            let (measure, mode) = match flags {
                "ce" => (Measure::Count, Mode::Enforce),
                "cs" => (Measure::Count, Mode::Shadow),
                "ae" => (Measure::Amount, Mode::Enforce),
                "as" => (Measure::Amount, Mode::Shadow),
                _ => return Err(CodecError::new(WHAT, format!("kept policy '{kind}'"))),
            };
            Ok(KeptPolicy {
                policy_id: policy.policy_id.clone(),
                measure,
                mode,
                limit: number("kept limit", limit)?,
                window_seconds: number("kept window", window)?,
                scope: policy.scope.clone(),
                alert_thresholds: super::replay::thresholds(WHAT, &alerts)?,
            })
        })
        .collect::<Result<_, CodecError>>()?;
    let record = ConsumeRecord::of_entry(entry, entry.at.timestamp_millis(), policies);
    Ok(format!("{}\n{numbers}", encode_consume_record(&record)))
}

/// Reads what [`encode`] wrote.
pub(super) fn decode(text: &str) -> Result<LedgerEntry, CodecError> {
    let version = [VERSION, VERSION_TOTALS]
        .into_iter()
        .find(|v| {
            text.strip_prefix(v)
                .is_some_and(|rest| rest.starts_with(US))
        })
        .ok_or_else(|| CodecError::new(WHAT, format!("not a version {VERSION} entry")))?;
    let has_totals = version == VERSION_TOTALS;
    let least = if has_totals { 14 } else { 13 };
    let mut fields: Vec<&str> = text[version.len() + US.len_utf8()..]
        .splitn(least + 2, US)
        .collect();
    fields.insert(0, version);
    if fields.len() < least {
        return Err(CodecError::new(WHAT, format!("fewer than {least} fields")));
    }
    let attributes = decode_attributes(fields.remove(12))?;
    let totals = match has_totals {
        true => decode_totals(fields.remove(12))?,
        false => Vec::new(),
    };
    let kind = fields[3]
        .chars()
        .next()
        .filter(|_| fields[3].len() == 1)
        .and_then(|letter| KIND_LETTERS.iter().position(|&l| l == letter))
        .map(|index| EntryKind::ALL[index])
        .ok_or_else(|| CodecError::new(WHAT, format!("unknown kind '{}'", fields[3])))?;
    let consumption_id = optional(fields[7])
        .map(|id| from_b64(id).map(ConsumptionId::from_bits))
        .transpose()?;
    let hold_id = optional(fields[8]).map(decode_hold_id).transpose()?;
    let amount = number("amount", fields[6])?;
    let at_ms = number("instant", fields[2])?;
    let policies = decode_policies(fields[10], amount)?;
    let suffix = format!("{}|{}", fields[4], fields[5]);
    let counters = decode_counters(fields[11], &policies, &suffix, at_ms)?;
    let (hold_expires_at, kept_answer) = decode_expiry_and_kept(fields.get(12..).unwrap_or(&[]))?;
    let compact_kept = kept_answer
        .as_ref()
        .is_some_and(|kept| !kept.text.starts_with('{'));
    let mut entry = super::row::entry_from_parts(
        EntryParts {
            id: &EntryId::from_bits(from_b64(fields[1])?).to_string(),
            at: instant(at_ms)?,
            kind: kind.as_str(),
            action: fields[4],
            subject: fields[5],
            amount,
            consumption_id: None,
            hold_id: None,
            idempotency_key: optional(fields[9]),
        },
        policies,
        attributes,
        super::row::Detail {
            counters,
            hold_expires_at,
            kept_answer,
        },
    )?;
    entry.consumption_id = consumption_id;
    entry.hold_id = hold_id;
    entry.totals = totals;
    if compact_kept {
        if let Some(mut kept) = entry.kept_answer.take() {
            kept.text = kept_text(&kept.text, &entry)?;
            entry.kept_answer = Some(kept);
        }
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_compact_entries_are_errors() {
        for text in [
            "2",
            "2\u{1f}x",
            "3\u{1f}x",
            "3\u{1f}a\u{1f}b\u{1f}c\u{1f}d\u{1f}e\u{1f}f\u{1f}g\u{1f}h\u{1f}i\u{1f}j\u{1f}k",
        ] {
            assert!(decode(text).is_err(), "{text:?}");
        }
    }
}
