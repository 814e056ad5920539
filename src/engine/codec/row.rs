//! A ledger entry as the SQL ledger's row holds it: scalar columns ([`EntryParts`]), the
//! `policies` column and the `detail` column (its internal part), both in the compact
//! form of module `fields`, read back against the row's own columns.

use super::fields::{
    decode_counters, decode_expiry_and_kept, write_counters, write_expiry_and_kept, KeySuffix,
    DETAIL_VERSION, POLICIES_VERSION, US, WHAT,
};
use super::{field, fields, CodecError};
use crate::domain::{
    Action, Attributes, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, IdempotencyKey,
    KeptAnswer, LedgerEntry, PolicyAmount, Subject,
};
use chrono::{DateTime, Utc};

/// An entry's internal part: its counters, a hold's expiry and a kept answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Detail {
    /// See [`LedgerEntry::counters`].
    pub(crate) counters: Vec<CounterCharge>,
    /// See [`LedgerEntry::hold_expires_at`].
    pub(crate) hold_expires_at: Option<DateTime<Utc>>,
    /// See [`LedgerEntry::kept_answer`].
    pub(crate) kept_answer: Option<KeptAnswer>,
}

#[cfg(test)]
impl Detail {
    pub(super) fn of(entry: &LedgerEntry) -> Self {
        Self {
            counters: entry.counters.clone(),
            hold_expires_at: entry.hold_expires_at,
            kept_answer: entry.kept_answer.clone(),
        }
    }
}

/// The SQL ledger's `detail` column in compact form: `d1`, then the fields
/// 11 (counters) and 13 to 15 (a hold's expiry, a kept answer) of the entry's compact form,
/// read back against the row's own action, subject, instant and policies; `None` when the
/// entry has none of them. A three-budget charge's detail takes about a third of its JSON.
pub(crate) fn encode_detail(entry: &LedgerEntry) -> Option<String> {
    if entry.counters.is_empty() && entry.hold_expires_at.is_none() && entry.kept_answer.is_none() {
        return None;
    }
    let mut out = String::with_capacity(96);
    out.push_str(DETAIL_VERSION);
    out.push(US);
    let suffix = KeySuffix {
        action: entry.action.as_str(),
        subject: entry.subject.as_str(),
    };
    write_counters(&mut out, entry, suffix, entry.at.timestamp_millis());
    write_expiry_and_kept(&mut out, entry);
    Some(out)
}

/// The SQL ledger's `policies` column in compact form: `p1`, then field 10
/// of the entry's compact form, read back against the row's own `amount`. A three-budget
/// charge's takes about a third of its JSON.
#[cfg(test)]
pub(crate) fn encode_policies(policies: &[PolicyAmount], amount: u64) -> String {
    use super::fields::write_policies;
    let mut out = String::with_capacity(8 + 24 * policies.len());
    out.push_str(POLICIES_VERSION);
    out.push(US);
    write_policies(&mut out, policies, amount);
    out
}

/// Reads what [`encode_policies`] wrote.
pub(crate) fn decode_policies(text: &str, amount: u64) -> Result<Vec<PolicyAmount>, CodecError> {
    let rest = text
        .strip_prefix(POLICIES_VERSION)
        .and_then(|rest| rest.strip_prefix(US))
        .ok_or_else(|| {
            CodecError::new(
                WHAT,
                format!("not a version {POLICIES_VERSION} policies column"),
            )
        })?;
    fields::decode_policies(rest, amount)
}

/// Reads what [`encode_detail`] wrote for the entry whose scalar fields are `parts`.
fn decode_compact_detail(
    text: &str,
    parts: &EntryParts<'_>,
    policies: &[PolicyAmount],
) -> Result<Detail, CodecError> {
    let fields: Vec<&str> = text
        .strip_prefix(DETAIL_VERSION)
        .and_then(|rest| rest.strip_prefix(US))
        .ok_or_else(|| CodecError::new(WHAT, "not a compact detail"))?
        .splitn(4, US)
        .collect();
    let suffix = format!("{}|{}", parts.action, parts.subject);
    let counters = decode_counters(fields[0], policies, &suffix, parts.at.timestamp_millis())?;
    let (hold_expires_at, kept_answer) = decode_expiry_and_kept(&fields[1..])?;
    Ok(Detail {
        counters,
        hold_expires_at,
        kept_answer,
    })
}

/// Reads the `detail` column [`encode_detail`] wrote for the row whose other columns are
/// `parts` and `policies`.
pub(crate) fn decode_detail(
    text: Option<&str>,
    parts: &EntryParts<'_>,
    policies: &[PolicyAmount],
) -> Result<Detail, CodecError> {
    match text {
        None => Ok(Detail::default()),
        Some(text) => decode_compact_detail(text, parts, policies),
    }
}

/// The scalar fields of an entry as text, as a stream entry or an SQL row holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryParts<'a> {
    /// The entry id, hyphenated.
    pub(crate) id: &'a str,
    /// When the decision was made.
    pub(crate) at: DateTime<Utc>,
    /// The kind's spelling ([`EntryKind::as_str`]).
    pub(crate) kind: &'a str,
    /// The action, checked as [`Action::parse`] does.
    pub(crate) action: &'a str,
    /// The subject, checked as [`Subject::parse`] does.
    pub(crate) subject: &'a str,
    /// The amount as the entry records it.
    pub(crate) amount: u64,
    /// The consumption id, if any.
    pub(crate) consumption_id: Option<&'a str>,
    /// The hold id, if any.
    pub(crate) hold_id: Option<&'a str>,
    /// The idempotency key, if any.
    pub(crate) idempotency_key: Option<&'a str>,
}

/// Builds an entry from its fields as text, checking each.
pub(crate) fn entry_from_parts(
    parts: EntryParts<'_>,
    policies: Vec<PolicyAmount>,
    attributes: Attributes,
    detail: Detail,
) -> Result<LedgerEntry, CodecError> {
    const WHAT: &str = "ledger entry";
    Ok(LedgerEntry {
        folded: Vec::new(),
        id: field(WHAT, EntryId::parse(parts.id))?,
        at: parts.at,
        kind: EntryKind::parse(parts.kind)
            .ok_or_else(|| CodecError::new(WHAT, format!("unknown kind '{}'", parts.kind)))?,
        action: field(WHAT, Action::parse("action", parts.action))?,
        subject: field(WHAT, Subject::parse("subject", parts.subject))?,
        amount: parts.amount,
        consumption_id: parts
            .consumption_id
            .map(|id| field(WHAT, ConsumptionId::parse(id)))
            .transpose()?,
        hold_id: parts
            .hold_id
            .map(|id| field(WHAT, HoldId::parse(id)))
            .transpose()?,
        idempotency_key: parts
            .idempotency_key
            .map(|key| field(WHAT, IdempotencyKey::parse(key)))
            .transpose()?,
        policies,
        attributes,
        counters: detail.counters,
        hold_expires_at: detail.hold_expires_at,
        kept_answer: detail.kept_answer,
        totals: Vec::new(),
    })
}
