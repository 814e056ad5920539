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
//! | 0 | version | `3` |
//! | 1 | id | [`b64`] |
//! | 2 | at | Unix ms |
//! | 3 | kind | one letter: `c`harge, `r`efund, `h`old, co`m`mit, re`l`ease, e`x`pire, `d`eny, `v`oid |
//! | 4, 5 | action, subject | as is |
//! | 6 | amount | decimal |
//! | 7 | consumption id | [`b64`], or empty |
//! | 8 | hold id | [`b64`] `.` shard, or empty |
//! | 9 | idempotency key | as is, or empty |
//! | 10 | policies | per policy: id `GS` amount (empty: the entry's amount), then `GS` and its scope's key names joined by `,` unless it is the default scope |
//! | 11 | counters | per counter: policy `GS` key `GS` restore `GS` by-amount (`1`/`0`) `GS` charged (empty: its policy's amount) |
//! | 12 | attributes | per attribute: key `GS` value |
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

use super::replay::{encode_consume_record, ConsumeRecord, KeptPolicy, KeptTerms};
use super::row::EntryParts;
use super::{field, CodecError};
use crate::domain::{
    Attributes, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, KeptAnswer, LedgerEntry,
    Measure, Mode, PolicyAmount, PolicyId, Restore, Scope,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// The first field of an entry's compact form.
const VERSION: &str = "3";
/// The first field of a `detail` column ([`encode_detail`]).
pub(super) const DETAIL_VERSION: &str = "d1";
/// The first field of a `policies` column ([`encode_policies`]).
pub(super) const POLICIES_VERSION: &str = "p1";
pub(super) const US: char = '\u{1f}';
const RS: char = '\u{1e}';
const GS: char = '\u{1d}';
pub(super) const WHAT: &str = "ledger entry";

/// The kinds' letters, in [`EntryKind::ALL`] order.
const KIND_LETTERS: [char; 8] = ['c', 'r', 'h', 'm', 'l', 'x', 'd', 'v'];

/// 128 bits as 22 characters of base 64 (URL alphabet, no padding), big-endian.
fn b64(bits: u128) -> String {
    URL_SAFE_NO_PAD.encode(bits.to_be_bytes())
}

/// Reads what [`b64`] wrote.
fn from_b64(text: &str) -> Result<u128, CodecError> {
    let bytes: Option<[u8; 16]> = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| bytes.try_into().ok());
    bytes
        .map(u128::from_be_bytes)
        .ok_or_else(|| CodecError::new(WHAT, format!("id '{text}'")))
}

/// The rolling bucket a charge at `at_ms` goes to (what the engine charges).
fn current_bucket(at_ms: i64, bucket_ms: i64) -> Option<i64> {
    (bucket_ms > 0).then(|| at_ms.div_euclid(bucket_ms))
}

fn kind_letter(kind: EntryKind) -> char {
    let index = EntryKind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
    KIND_LETTERS[index]
}

/// The compact form of `entry`.
pub(super) fn encode(entry: &LedgerEntry) -> String {
    let mut out = String::with_capacity(160);
    let suffix = format!("{}|{}", entry.action, entry.subject);
    let at_ms = entry.at.timestamp_millis();
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{VERSION}{US}{}{US}{}{US}{}{US}{}{US}{}{US}{}{US}",
        b64(entry.id.to_bits()),
        at_ms,
        kind_letter(entry.kind),
        entry.action,
        entry.subject,
        entry.amount,
    );
    if let Some(id) = entry.consumption_id {
        out.push_str(&b64(id.to_bits()));
    }
    out.push(US);
    if let Some(id) = entry.hold_id {
        let _ = write!(out, "{}.{}", b64(id.uuid_bits()), id.shard());
    }
    out.push(US);
    if let Some(key) = &entry.idempotency_key {
        out.push_str(key.as_str());
    }
    out.push(US);
    write_policies(&mut out, &entry.policies, entry.amount);
    out.push(US);
    write_counters(&mut out, entry, &suffix, at_ms);
    out.push(US);
    for (i, (key, value)) in entry.attributes.iter().enumerate() {
        if i > 0 {
            out.push(RS);
        }
        let _ = write!(out, "{key}{GS}{value}");
    }
    write_expiry_and_kept(&mut out, entry);
    out
}

/// Field 10: the entry's policies, their amounts relative to the entry's `amount`.
pub(super) fn write_policies(out: &mut String, policies: &[PolicyAmount], amount: u64) {
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            out.push(RS);
        }
        let _ = write!(out, "{}{GS}", p.policy_id);
        if p.amount != amount {
            let _ = write!(out, "{}", p.amount);
        }
        if !p.scope.is_default() {
            let _ = write!(out, "{GS}{}", p.scope.names());
        }
    }
}

/// Field 11: the entry's counters, their keys relative to `suffix` (`<action>|<subject>`).
pub(super) fn write_counters(out: &mut String, entry: &LedgerEntry, suffix: &str, at_ms: i64) {
    for (i, c) in entry.counters.iter().enumerate() {
        if i > 0 {
            out.push(RS);
        }
        let policy = entry
            .policies
            .iter()
            .position(|p| p.policy_id == c.policy_id);
        match policy {
            Some(index) if index == i => {}
            Some(index) => {
                let _ = write!(out, "{index}");
            }
            None => {
                let _ = write!(out, "~{}", c.policy_id);
            }
        }
        out.push(GS);
        match c.key.strip_suffix(suffix) {
            Some(head) => {
                let _ = write!(out, "+{head}");
            }
            None => {
                let _ = write!(out, "={}", c.key);
            }
        }
        out.push(GS);
        let _ = match c.restore {
            Restore::Calendar { period_end_ms } => write!(out, "c{period_end_ms}"),
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            } if Some(bucket) == current_bucket(at_ms, bucket_ms) => {
                write!(out, "r,{bucket_ms},{buckets}")
            }
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            } => write!(out, "r{bucket},{bucket_ms},{buckets}"),
            Restore::TokenBucket { period_ms, limit } => write!(out, "t{period_ms},{limit}"),
            Restore::Lifetime => write!(out, "l"),
            Restore::ZonedCalendar {
                period_end_ms,
                charged_at_ms,
            } if charged_at_ms == at_ms => write!(out, "z{period_end_ms}"),
            Restore::ZonedCalendar {
                period_end_ms,
                charged_at_ms,
            } => write!(out, "z{period_end_ms},{charged_at_ms}"),
        };
        let _ = write!(out, "{GS}{}{GS}", u8::from(c.by_amount));
        if Some(c.charged) != policy.map(|index| entry.policies[index].amount) {
            let _ = write!(out, "{}", c.charged);
        }
    }
}

/// Fields 13 to 15, each with the separator before it: a hold's expiry and a kept answer
/// (nothing when the entry has neither).
pub(super) fn write_expiry_and_kept(out: &mut String, entry: &LedgerEntry) {
    let hold_expiry = entry.hold_expires_at.map(|at| at.timestamp_millis());
    if hold_expiry.is_some() || entry.kept_answer.is_some() {
        out.push(US);
        if let Some(ms) = hold_expiry {
            let _ = write!(out, "{ms}");
        }
    }
    if let Some(kept) = &entry.kept_answer {
        let _ = write!(out, "{US}{}{US}{}", kept.expires_at_ms, kept.text);
    }
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
    let record = ConsumeRecord {
        consumption_id: entry.consumption_id,
        hold: entry
            .hold_id
            .zip(entry.hold_expires_at.map(|at| at.timestamp_millis())),
        amount: entry.amount,
        at_ms: entry.at.timestamp_millis(),
        policies,
        attributes: entry.attributes.clone(),
    };
    Ok(format!("{}\n{numbers}", encode_consume_record(&record)))
}

fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, CodecError> {
    text.parse()
        .map_err(|_| CodecError::new(WHAT, format!("{what} '{text}' is not a number")))
}

fn instant(ms: i64) -> Result<DateTime<Utc>, CodecError> {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .ok_or_else(|| CodecError::new(WHAT, format!("instant {ms} ms")))
}

fn optional(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// Reads what [`encode`] wrote.
pub(super) fn decode(text: &str) -> Result<LedgerEntry, CodecError> {
    let mut fields: Vec<&str> = text
        .strip_prefix(VERSION)
        .and_then(|rest| rest.strip_prefix(US))
        .ok_or_else(|| CodecError::new(WHAT, format!("not a version {VERSION} entry")))?
        .splitn(15, US)
        .collect();
    fields.insert(0, VERSION);
    if fields.len() < 13 {
        return Err(CodecError::new(WHAT, "fewer than 13 fields"));
    }
    let attributes = decode_attributes(fields.remove(12))?;
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
    if compact_kept {
        if let Some(mut kept) = entry.kept_answer.take() {
            kept.text = kept_text(&kept.text, &entry)?;
            entry.kept_answer = Some(kept);
        }
    }
    Ok(entry)
}

/// Reads what [`write_expiry_and_kept`] wrote, split at its separators: a hold's expiry,
/// then a kept answer's expiry and text (each optional).
pub(super) fn decode_expiry_and_kept(
    fields: &[&str],
) -> Result<(Option<DateTime<Utc>>, Option<KeptAnswer>), CodecError> {
    let hold_expires_at = fields
        .first()
        .copied()
        .and_then(optional)
        .map(|ms| number("hold expiry", ms).and_then(instant))
        .transpose()?;
    let kept_answer = match (fields.get(1), fields.get(2)) {
        (Some(ms), Some(text)) => Some(KeptAnswer {
            expires_at_ms: number("kept answer's expiry", ms)?,
            text: (*text).to_owned(),
        }),
        (None, None) => None,
        _ => return Err(CodecError::new(WHAT, "a kept answer without its text")),
    };
    Ok((hold_expires_at, kept_answer))
}

fn decode_hold_id(text: &str) -> Result<HoldId, CodecError> {
    let (uuid, shard) = text
        .split_once('.')
        .ok_or_else(|| CodecError::new(WHAT, format!("hold id '{text}'")))?;
    Ok(HoldId::from_parts(from_b64(uuid)?, number("shard", shard)?))
}

fn items(text: &str) -> impl Iterator<Item = &str> {
    text.split(RS).filter(|item| !item.is_empty())
}

fn decode_attributes(text: &str) -> Result<Attributes, CodecError> {
    let pairs = items(text)
        .map(|item| {
            item.split_once(GS)
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| CodecError::new(WHAT, "an attribute without its value"))
        })
        .collect::<Result<Vec<_>, CodecError>>()?;
    field(WHAT, Attributes::parse("attributes", pairs))
}

pub(super) fn decode_policies(text: &str, amount: u64) -> Result<Vec<PolicyAmount>, CodecError> {
    items(text)
        .map(|item| {
            let mut parts = item.splitn(3, GS);
            let (Some(id), Some(policy_amount)) = (parts.next(), parts.next()) else {
                return Err(CodecError::new(WHAT, "a policy without its amount"));
            };
            Ok(PolicyAmount {
                policy_id: field(WHAT, PolicyId::parse("policy_id", id))?,
                amount: match optional(policy_amount) {
                    None => amount,
                    Some(text) => number("policy amount", text)?,
                },
                scope: match parts.next() {
                    None => Scope::default(),
                    Some(names) => field(WHAT, Scope::from_names(names))?,
                },
            })
        })
        .collect()
}

pub(super) fn decode_counters(
    text: &str,
    policies: &[PolicyAmount],
    suffix: &str,
    at_ms: i64,
) -> Result<Vec<CounterCharge>, CodecError> {
    items(text)
        .enumerate()
        .map(|(i, item)| {
            let parts: Vec<&str> = item.split(GS).collect();
            let [policy, key, restore, by_amount, charged] = parts[..] else {
                return Err(CodecError::new(WHAT, format!("counter '{item}'")));
            };
            let (policy_id, policy_amount, scope) = match policy.strip_prefix('~') {
                Some(id) => (
                    field(WHAT, PolicyId::parse("policy_id", id))?,
                    None,
                    Scope::default(),
                ),
                None => {
                    let index = match optional(policy) {
                        None => i,
                        Some(index) => number::<usize>("policy index", index)?,
                    };
                    let policy = policies
                        .get(index)
                        .ok_or_else(|| CodecError::new(WHAT, format!("policy index {index}")))?;
                    (
                        policy.policy_id.clone(),
                        Some(policy.amount),
                        policy.scope.clone(),
                    )
                }
            };
            let key = match (key.strip_prefix('+'), key.strip_prefix('=')) {
                (Some(head), _) => format!("{head}{suffix}"),
                (None, Some(key)) => key.to_owned(),
                _ => return Err(CodecError::new(WHAT, format!("counter key '{key}'"))),
            };
            Ok(CounterCharge {
                policy_id,
                key,
                restore: decode_restore(restore, at_ms)?,
                by_amount: match by_amount {
                    "1" => true,
                    "0" => false,
                    other => return Err(CodecError::new(WHAT, format!("by-amount '{other}'"))),
                },
                charged: match (optional(charged), policy_amount) {
                    (Some(text), _) => number("charged", text)?,
                    (None, Some(amount)) => amount,
                    (None, None) => return Err(CodecError::new(WHAT, "a charge without units")),
                },
                scope,
            })
        })
        .collect()
}

fn decode_restore(text: &str, at_ms: i64) -> Result<Restore, CodecError> {
    let bad = || CodecError::new(WHAT, format!("restore '{text}'"));
    let mut chars = text.chars();
    let kind = chars.next().ok_or_else(bad)?;
    let numbers: Vec<&str> = chars.as_str().split(',').collect();
    match (kind, &numbers[..]) {
        ('l', [""]) => Ok(Restore::Lifetime),
        ('c', [end]) => Ok(Restore::Calendar {
            period_end_ms: number("period end", end)?,
        }),
        ('r', [bucket, bucket_ms, buckets]) => {
            let (bucket_ms, buckets) =
                (number("bucket ms", bucket_ms)?, number("buckets", buckets)?);
            if bucket_ms <= 0 || buckets <= 0 {
                return Err(bad());
            }
            let bucket = match optional(bucket) {
                None => current_bucket(at_ms, bucket_ms).ok_or_else(bad)?,
                Some(text) => number("bucket", text)?,
            };
            Ok(Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            })
        }
        ('z', [end]) => Ok(Restore::ZonedCalendar {
            period_end_ms: number("period end", end)?,
            charged_at_ms: at_ms,
        }),
        ('z', [end, charged_at]) => Ok(Restore::ZonedCalendar {
            period_end_ms: number("period end", end)?,
            charged_at_ms: number("charged at", charged_at)?,
        }),
        ('t', [period_ms, limit]) => {
            let period_ms = number("period ms", period_ms)?;
            if period_ms <= 0 {
                return Err(bad());
            }
            Ok(Restore::TokenBucket {
                period_ms,
                limit: number("limit", limit)?,
            })
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_in_base_64_read_back_and_malformed_ones_are_refused() {
        for bits in [0, 1, u128::MAX, 0x0193_a3c4_0000_7000_8000_0000_0000_002a] {
            let text = b64(bits);
            assert_eq!(text.len(), 22);
            assert_eq!(from_b64(&text), Ok(bits), "{text}");
        }
        for bad in [
            "",
            "AAAA",
            "AAAAAAAAAAAAAAAAAAAAAB",
            "AAAAAAAAAAAAAAAAAAAAA*",
        ] {
            assert!(from_b64(bad).is_err(), "{bad}");
        }
    }

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
        for restore in ["", "c", "cx", "r1,0,5", "r1,5", "t0,5", "q1"] {
            assert!(decode_restore(restore, 0).is_err(), "{restore:?}");
        }
    }
}
