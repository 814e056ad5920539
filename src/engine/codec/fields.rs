//! The fields a ledger entry's compact form (module `entry`) shares with the SQL row's
//! `policies` and `detail` columns (module `row`): separators, ids in base 64, a policy's
//! amounts, a counter's key and restore, a hold's expiry and a kept answer. The forms are
//! described in `entry`'s module doc; both modules write and read them only here.

use super::{field, CodecError};
use crate::domain::{
    Attributes, CounterCharge, HoldId, KeptAnswer, LedgerEntry, PolicyAmount, PolicyId, Restore,
    Scope,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// The first field of a `detail` column (`row::encode_detail`).
pub(super) const DETAIL_VERSION: &str = "d1";

/// The first field of a `policies` column (`row::encode_policies`).
pub(super) const POLICIES_VERSION: &str = "p1";

pub(super) const US: char = '\u{1f}';

pub(super) const RS: char = '\u{1e}';

pub(super) const GS: char = '\u{1d}';

pub(super) const WHAT: &str = "ledger entry";

/// Appends 128 bits to `out` as 22 characters of base 64 (URL alphabet, no padding),
/// big-endian.
pub(super) fn push_b64(out: &mut String, bits: u128) {
    URL_SAFE_NO_PAD.encode_string(bits.to_be_bytes(), out);
}

/// Appends `n` in decimal to `out` (what `write!(out, "{n}")` writes, without formatting
/// machinery: the compact form is written on every consume's path).
pub(super) fn push_int(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Reads what [`push_b64`] wrote.
pub(super) fn from_b64(text: &str) -> Result<u128, CodecError> {
    let bytes: Option<[u8; 16]> = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| bytes.try_into().ok());
    bytes
        .map(u128::from_be_bytes)
        .ok_or_else(|| CodecError::new(WHAT, format!("id '{text}'")))
}

/// The rolling bucket a charge at `at_ms` goes to (what the engine charges).
pub(super) fn current_bucket(at_ms: i64, bucket_ms: i64) -> Option<i64> {
    (bucket_ms > 0).then(|| at_ms.div_euclid(bucket_ms))
}

/// Field 10: the entry's policies, their amounts relative to the entry's `amount`.
pub(super) fn write_policies(out: &mut String, policies: &[PolicyAmount], amount: u64) {
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            out.push(RS);
        }
        out.push_str(p.policy_id.as_str());
        out.push(GS);
        if p.amount != amount {
            push_int(out, p.amount);
        }
        if !p.scope.is_default() {
            let _ = write!(out, "{GS}{}", p.scope.names());
        }
    }
}

/// The end every counter key of an entry shares, `<action>|<subject>` (`crate::keys`),
/// held as its two parts.
#[derive(Clone, Copy)]
pub(super) struct KeySuffix<'a> {
    pub action: &'a str,
    pub subject: &'a str,
}

impl KeySuffix<'_> {
    /// The part of `key` before the suffix, when it ends with it.
    fn strip<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_suffix(self.subject)?
            .strip_suffix('|')?
            .strip_suffix(self.action)
    }
}

/// Field 11: the entry's counters, their keys relative to `suffix` (`<action>|<subject>`).
pub(super) fn write_counters(
    out: &mut String,
    entry: &LedgerEntry,
    suffix: KeySuffix<'_>,
    at_ms: i64,
) {
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
            Some(index) => push_int(out, index),
            None => {
                out.push('~');
                out.push_str(c.policy_id.as_str());
            }
        }
        out.push(GS);
        match suffix.strip(&c.key) {
            Some(head) => {
                out.push('+');
                out.push_str(head);
            }
            None => {
                out.push('=');
                out.push_str(&c.key);
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
        out.push(GS);
        out.push(if c.by_amount { '1' } else { '0' });
        out.push(GS);
        if Some(c.charged) != policy.map(|index| entry.policies[index].amount) {
            push_int(out, c.charged);
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

pub(super) fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, CodecError> {
    text.parse()
        .map_err(|_| CodecError::new(WHAT, format!("{what} '{text}' is not a number")))
}

pub(super) fn instant(ms: i64) -> Result<DateTime<Utc>, CodecError> {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .ok_or_else(|| CodecError::new(WHAT, format!("instant {ms} ms")))
}

pub(super) fn optional(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
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

pub(super) fn decode_hold_id(text: &str) -> Result<HoldId, CodecError> {
    let (uuid, shard) = text
        .split_once('.')
        .ok_or_else(|| CodecError::new(WHAT, format!("hold id '{text}'")))?;
    Ok(HoldId::from_parts(from_b64(uuid)?, number("shard", shard)?))
}

pub(super) fn items(text: &str) -> impl Iterator<Item = &str> {
    text.split(RS).filter(|item| !item.is_empty())
}

pub(super) fn decode_attributes(text: &str) -> Result<Attributes, CodecError> {
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

pub(super) fn decode_restore(text: &str, at_ms: i64) -> Result<Restore, CodecError> {
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
            let mut text = String::from("x");
            push_b64(&mut text, bits);
            let text = &text[1..];
            assert_eq!(text.len(), 22);
            assert_eq!(from_b64(text), Ok(bits), "{text}");
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
    fn malformed_restores_are_errors() {
        for restore in ["", "c", "cx", "r1,0,5", "r1,5", "t0,5", "q1"] {
            assert!(decode_restore(restore, 0).is_err(), "{restore:?}");
        }
    }
}
