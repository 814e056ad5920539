//! Redis (and memory-store) keys: the only place where they are formatted.
//!
//! Layout of the keys of one (action, subject):
//! `<prefix>:{<shard>}:<action>|<subject>:<policy id>:<measure><window fingerprint>[:<period>]`
//! and, for the same subject, `…|<subject>:#i:<scope>:<idempotency key>`.
//! Per shard: `<prefix>:{<shard>}:#ledger` (the ledger stream), `#holds` (open holds by
//! expiry), `#h:<hold id>` (a hold) and `#rf:<consumption id>` (refunded so far).
//!
//! - `{<shard>}` is the Redis Cluster **hash tag**. The shard is a hash of (action, subject)
//!   modulo [`SHARDS`], so every key one decision touches, including the ledger stream the
//!   script appends to, lives in one slot. 64 shards spread over the cluster's nodes; the
//!   ledger drain reads one stream per shard.
//! - The encoding is injective: actions never contain `|`; the subject is percent-escaped
//!   for `%`, `{`, `}` and `:` so it ends at the next `:`; policy ids never contain `:` or
//!   `#`, so the `#…` keys cannot collide with counters.
//! - The limit is not part of a counter key (raising it keeps today's usage); the window and
//!   the measure are (changing either starts counting afresh).

use crate::domain::{Action, Measure, Policy, Subject};
use std::fmt::Write;

/// How many shards (hash tags) keys are spread over.
pub const SHARDS: u16 = 64;

/// The shard of (action, subject): FNV-1a (64-bit) of both, modulo [`SHARDS`].
///
/// FNV-1a is fixed forever here: changing it would move every counter to a new key.
pub fn shard(action: &str, subject: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = action
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(subject.bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(SHARDS)) as u16
}

/// `<prefix>:{<shard>}`: the start of every key of one shard.
pub fn shard_prefix(prefix: &str, shard: u16) -> String {
    format!("{prefix}:{{{shard}}}")
}

/// The ledger stream of a shard.
pub fn ledger_stream(prefix: &str, shard: u16) -> String {
    format!("{prefix}:{{{shard}}}:#ledger")
}

/// The sorted set of a shard's open holds, scored by expiry (ms).
pub fn holds_index(prefix: &str, shard: u16) -> String {
    format!("{prefix}:{{{shard}}}:#holds")
}

/// The record of one hold.
pub fn hold_record(prefix: &str, shard: u16, hold_id: &str) -> String {
    format!("{prefix}:{{{shard}}}:#h:{hold_id}")
}

/// How much of one consumption has been refunded so far.
pub fn refunded_total(prefix: &str, shard: u16, consumption_id: &str) -> String {
    format!("{prefix}:{{{shard}}}:#rf:{consumption_id}")
}

/// Appends `subject` to `out`, escaping `%`, `{`, `}` and `:`.
fn push_escaped(out: &mut String, subject: &str) {
    for c in subject.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            _ => out.push(c),
        }
    }
}

/// The keys of one (action, subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectKeys {
    /// Its shard.
    pub shard: u16,
    /// `<prefix>:{<shard>}:<action>|<escaped subject>`.
    base: String,
}

impl SubjectKeys {
    /// The keys of `subject` doing `action` under `prefix`.
    pub fn new(prefix: &str, action: &Action, subject: &Subject) -> Self {
        let shard = shard(action.as_str(), subject.as_str());
        let mut base = String::with_capacity(
            prefix.len() + action.as_str().len() + subject.as_str().len() + 8,
        );
        // Writing to a String cannot fail.
        let _ = write!(base, "{prefix}:{{{shard}}}:{}|", action.as_str());
        push_escaped(&mut base, subject.as_str());
        Self { shard, base }
    }

    /// The counter key of `policy`; `period` names a calendar period (its start, Unix s).
    pub fn counter(&self, policy: &Policy, period: Option<i64>) -> String {
        let mut key = String::with_capacity(self.base.len() + 48);
        key.push_str(&self.base);
        key.push(':');
        key.push_str(policy.id.as_str());
        key.push(':');
        key.push(match policy.spec.measure {
            Measure::Count => 'n',
            Measure::Amount => 'a',
        });
        key.push_str(&policy.spec.window.fingerprint());
        if let Some(period) = period {
            let _ = write!(key, ":{period}");
        }
        key
    }

    /// The record of an idempotency key; `scope` separates consumes (`c`) from holds (`h`).
    pub fn idempotency(&self, scope: char, key: &str) -> String {
        format!("{}:#i:{scope}:{key}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_of(subject: &str) -> SubjectKeys {
        let action = Action::parse("action", "sms.send").expect("valid");
        SubjectKeys::new("ql", &action, &Subject::parse("s", subject).expect("valid"))
    }

    #[test]
    fn the_hash_tag_is_the_shard_whatever_the_subject_contains() {
        for subject in ["user-42", "{evil}", "a}b{c", "50%", "x:y|z", "Zoë ünïcode"] {
            let keys = keys_of(subject);
            let key = &keys.base;
            let open = key.find('{').expect("has a tag");
            let close = key[open..].find('}').expect("tag closes") + open;
            assert_eq!(&key[open + 1..close], keys.shard.to_string(), "{key}");
            assert!(keys.shard < SHARDS);
        }
    }

    #[test]
    fn different_subjects_never_share_a_key() {
        let subjects = [
            "a", "a%7D", "a}", "a%", "a%25", "{a", "%7Ba", "a|b", "a b", "a:b", "a%3Ab",
        ];
        let keys: std::collections::HashSet<String> =
            subjects.iter().map(|s| keys_of(s).base).collect();
        assert_eq!(keys.len(), subjects.len());
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
}
