//! Redis (and memory-store) keys: the only place where they are formatted.
//!
//! Layout of the keys of one (action, subject), with `<p>` the prefix and `<s>` the shard:
//!
//! | key | layout |
//! |---|---|
//! | a counter | `<p>{<s>}<policy key>[<period>]<action>\|<subject>` |
//! | an idempotency record | `<p>{<s>}#i<scope><length>:<idempotency key><action>\|<subject>` |
//! | the shard's ledger stream | `<p>{<s>}#ledger` |
//! | the shard's index of open holds | `<p>{<s>}#holds` |
//! | a hold | `<p>{<s>}#h<hold id>` |
//! | a consumption's refunded total | `<p>{<s>}#rf<consumption id>` |
//! | the shard's epoch: set once its state was rebuilt from the ledger | `<p>{<s>}#epoch` |
//! | the shard's write generation: what changed it last, against the ledger's floor | `<p>{<s>}#gen` |
//! | the lock of the shard's rebuild | `<p>{<s>}#rebuild` |
//! | an idempotency record whose answer was replayed; a voided charge's once-marker | `<p>{<s>}#o<scope><length>:<idempotency key><action>\|<subject>`, `<p>{<s>}#vo<consumption id>` |
//! | while a `counters verify` reads the shard: its token, and the entries acknowledged meanwhile | `<p>{<s>}#vh`, `<p>{<s>}#vd` |
//! | Redis Cluster, a consume across slots: its intent at home, the home's index of intents, its reservation in a foreign slot, a give-back's once-marker there | `<p>{<s>}#x<attempt>`, `<p>{<s>}#xs`, `<p>{<s>}#rv<attempt>`, `<p>{<s>}#gb<entry id>` |
//!
//! - `{<s>}` is the Redis Cluster **hash tag**: one character naming one of [`SHARDS`]
//!   shards, a hash of (action, subject). Every key one decision touches, including the
//!   ledger stream its script appends to, lives in one slot; 64 shards spread over the
//!   cluster's primaries, and the ledger drain reads one stream per shard.
//! - The **policy key** is [`POLICY_KEY_LEN`] base-62 digits: a hash of the policy id, the
//!   measure and the window ([`policy_key`]), computed once per policy when the policy cache
//!   is built. The limit is not part of it (raising it keeps today's usage); the window and
//!   the measure are (changing either starts counting afresh).
//! - The **period** (calendar windows only) is the Unix second at which the period starts,
//!   as [`PERIOD_LEN`] base-62 digits (years 1970 to 3770).
//! - The encoding is injective: the shard and the policy key have fixed lengths, a policy
//!   key says whether a period follows, actions never contain `|`, and the subject comes
//!   last, so it needs no escaping. `#` is never a base-62 digit, so the `#…` keys cannot
//!   collide with counters.
//!
//! Why so short: Redis 7 keeps a key's name in an allocation that jemalloc rounds up to 32
//! bytes for names of up to 28 bytes, 48 up to 44 and 64 up to 60, besides about 85 bytes
//! for the key itself. A calendar counter of a short action and subject (`sms`, `u12345`)
//! has a 28-byte name.

use crate::domain::{Action, Budget, Policy, Subject};

/// How many shards (hash tags) keys are spread over.
pub const SHARDS: u16 = 64;

/// Length of a [`PolicyKey`], in base-62 digits.
pub(crate) const POLICY_KEY_LEN: usize = 7;

/// Length of a calendar period in a counter key, in base-62 digits.
pub(crate) const PERIOD_LEN: usize = 6;

/// The digits of base 62, in order.
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The shard names: one character each, never `{` or `}`.
const SHARD_NAMES: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";

/// The shard of (action, subject): FNV-1a (64-bit) of both, modulo [`SHARDS`].
///
/// Fixed forever: changing it would move every counter to a new key.
pub(crate) fn shard(action: &str, subject: &str) -> u16 {
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

/// The shard of a budget shared by subjects (its scope names no subject): FNV-1a over the
/// action, a 0xFE byte (never in UTF-8, so never a [`shard`] input), then the budget's keys
/// and values in key order, separated by 0xFF, modulo [`SHARDS`]. Every policy of an action
/// with the same scope keys and values shares it. Fixed forever, like [`shard`].
pub(crate) fn budget_shard(action: &str, budget: &Budget) -> u16 {
    let mut pairs: Vec<(&str, &str)> = budget.iter().collect();
    pairs.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |byte: u8| {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    };
    action.bytes().for_each(&mut eat);
    eat(0xfe);
    for (key, value) in pairs {
        eat(0xff);
        key.bytes().for_each(&mut eat);
        eat(0xff);
        value.bytes().for_each(&mut eat);
    }
    (hash % u64::from(SHARDS)) as u16
}

/// A counter's key and the shard it lives in. This module builds it, so the shard is known
/// from the start and never parsed back out of the text; a key read back from persisted
/// text (a ledger entry's counters) goes through [`CounterKey::read`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    shard: u16,
    text: String,
}

impl CounterKey {
    /// The key `text` of a counter in `shard`.
    fn new(shard: u16, text: String) -> Self {
        Self { shard, text }
    }

    /// A key read back from its text: its shard is the one its hash tag names (0 for a
    /// tag that names none, as the stores' tests use).
    pub fn read(text: impl Into<String>) -> Self {
        let text = text.into();
        let shard = shard_of_tag(hash_tag(&text)).unwrap_or(0);
        Self { shard, text }
    }

    /// The shard the counter lives in.
    pub fn shard(&self) -> u16 {
        self.shard
    }

    /// The full key (prefix and hash tag included).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for CounterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The counter of a budget shared by subjects, `<p>{<s>}<policy key>[<period>]<action>|`
/// then the budget's values in scope order, each but the last as `<length>:<value>` (the
/// policy key fixes how many there are; the global budget has none), in
/// [`budget_shard`]'s shard.
pub(crate) fn shared_counter(
    prefix: &str,
    action: &Action,
    policy_key: &PolicyKey,
    period: Option<i64>,
    budget: &Budget,
) -> CounterKey {
    let shard = budget_shard(action.as_str(), budget);
    let mut key = shard_prefix(prefix, shard);
    key.push_str(policy_key.as_str());
    if let Some(period) = period {
        push_period(&mut key, period);
    }
    key.push_str(action.as_str());
    key.push('|');
    let values: Vec<&str> = budget.iter().map(|(_, value)| value).collect();
    if let Some((last, rest)) = values.split_last() {
        for value in rest {
            key.push_str(&value.len().to_string());
            key.push(':');
            key.push_str(value);
        }
        key.push_str(last);
    }
    CounterKey::new(shard, key)
}

/// The shard of a key read back as text (a ledger entry's counter, a dumped record, a
/// script's key): the one its hash tag names, if it is one of ours. Keys this module
/// builds for a decision carry their shard ([`CounterKey`]).
pub(crate) fn shard_of(key: &str) -> Option<u16> {
    shard_of_tag(hash_tag(key))
}

/// The shard a hash tag names (the inverse of the name [`shard_prefix`] gives it).
pub(crate) fn shard_of_tag(tag: &str) -> Option<u16> {
    match tag.as_bytes() {
        [name] => SHARD_NAMES
            .iter()
            .position(|n| n == name)
            .and_then(|shard| u16::try_from(shard).ok()),
        _ => None,
    }
}

/// `<prefix>{<shard>}`: the start of every key of one shard.
pub(crate) fn shard_prefix(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "")
}

/// `<prefix>{<shard>}<suffix>`, in one allocation (these keys are named on every decision).
fn shard_key(prefix: &str, shard: u16, suffix: &str) -> String {
    let name = char::from(SHARD_NAMES[usize::from(shard) % SHARD_NAMES.len()]);
    let mut key = String::with_capacity(prefix.len() + 3 + suffix.len());
    key.push_str(prefix);
    key.push('{');
    key.push(name);
    key.push('}');
    key.push_str(suffix);
    key
}

/// The ledger stream of a shard.
pub fn ledger_stream(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#ledger")
}

/// The hash of a shard's consumes recorded in the ledger's totals, waiting to be moved
/// into SQL (`engine::pipeline::drain`): field the allowed entry's id (`!` after it for a
/// denial), value the entry; field `#` names the content (the id of its first consume).
pub fn totals_waiting(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#tot")
}

/// [`totals_waiting`] renamed, while the drain moves it.
pub fn totals_moving(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#totm")
}

/// The sorted set of a shard's open holds, scored by expiry (ms).
pub fn holds_index(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#holds")
}

/// The record of one hold.
pub fn hold_record(prefix: &str, shard: u16, hold_id: &str) -> String {
    shard_key(prefix, shard, &format!("#h{hold_id}"))
}

/// The shard's epoch: present while the shard's state in Redis is the ledger's (set by a
/// rebuild from the ledger). Every script refuses to decide on a shard without it: Redis
/// lost its data, or has never been rebuilt.
pub fn epoch(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#epoch")
}

/// The shard's write generation: incremented by every script that changes the shard, in
/// the same atomic step (`counters::redis::generations`). The scripts name it from the
/// epoch's key, whose `#epoch` becomes `#gen`.
pub(crate) fn generation(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#gen")
}

/// The epoch of the shard `key` (any key of [`SubjectKeys`] or of a shard) lives in.
pub(crate) fn epoch_of(key: &str) -> String {
    [shard_part(key), "#epoch"].concat()
}

/// The start of `key` that names its shard, `<prefix>{<s>}`: equal for every key of a shard.
pub(crate) fn shard_part(key: &str) -> &str {
    let end = key.find('}').map_or(key.len(), |close| close + 1);
    &key[..end]
}

/// The lease of the janitor: the one instance that sweeps after dead ones
/// (`engine::janitor`). Outside every shard.
pub(crate) fn janitor_lease(prefix: &str) -> String {
    format!("{prefix}janitor")
}

/// A key the ledger drain writes before it waits for the replicas
/// (`QUOTA_REDIS_MIN_REPLICAS`): `WAIT` covers what its own connection wrote. Outside every
/// shard.
pub(crate) fn replication_fence(prefix: &str) -> String {
    format!("{prefix}fence")
}

/// [`replication_fence`] on a Redis Cluster: in the slot of `stream`, so that the write
/// and the `WAIT` after it go to the node the drain read the stream from.
pub(crate) fn replication_fence_of(prefix: &str, stream: &str) -> String {
    match shard_of(stream) {
        Some(shard) => shard_key(prefix, shard, "#fence"),
        None => replication_fence(prefix),
    }
}

/// The lock one instance holds while it rebuilds the shard.
pub fn rebuild_lock(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#rebuild")
}

/// A consume across Redis Cluster slots: its intent, at home (`engine::crossslot`).
pub(crate) fn intent(prefix: &str, shard: u16, attempt: &str) -> String {
    shard_key(prefix, shard, &format!("#x{attempt}"))
}

/// The shard's index of open intents, scored by deadline (ms).
pub(crate) fn intents_index(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#xs")
}

/// How many times a step across Redis Cluster slots changed the shard's counters (an
/// intent opened or abandoned, a reservation made or undone, a share given back): a verify
/// reads it before and after to know the budgets shared by subjects settled. The scripts
/// derive it from the step's own key: everything up to its last `#`, then `#xv`.
pub(crate) fn cross_slot_version(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#xv")
}

/// A consume across Redis Cluster slots: its reservation in a foreign slot.
pub(crate) fn reservation(prefix: &str, shard: u16, attempt: &str) -> String {
    shard_key(prefix, shard, &format!("#rv{attempt}"))
}

/// The marker of a give-back's share once given to a foreign slot's counters.
pub(crate) fn giveback_marker(prefix: &str, shard: u16, entry: &str) -> String {
    shard_key(prefix, shard, &format!("#gb{entry}"))
}

/// Set to a `counters verify`'s token while it reads the shard at one instant
/// (`engine::cut`): the drain then acknowledges entries without deleting them from the
/// stream, so that every entry the verify needs is in SQL or in the stream.
pub(crate) fn deletes_held(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#vh")
}

/// The ids of the entries acknowledged while deletions were held; deleted from the
/// stream when the verify lets go (or, if it died, by the next acknowledgement).
pub(crate) fn held_entries(prefix: &str, shard: u16) -> String {
    shard_key(prefix, shard, "#vd")
}

/// Set when an idempotency record's answer was replayed to a retry: the outcome is the
/// caller's, and the attempt it records is never voided (`engine::recovery::void`). The record's
/// key with `#o` for `#i` (consume.lua makes it the same way).
pub(crate) fn outcome_given(idempotency_record: &str) -> String {
    idempotency_record.replacen("}#i", "}#o", 1)
}

/// The once-marker of a voided charge (`engine::recovery::void`).
pub(crate) fn void_marker(prefix: &str, shard: u16, consumption_id: &str) -> String {
    shard_key(prefix, shard, &format!("#vo{consumption_id}"))
}

/// How much of one consumption has been refunded so far.
pub(crate) fn refunded_total(prefix: &str, shard: u16, consumption_id: &str) -> String {
    shard_key(prefix, shard, &format!("#rf{consumption_id}"))
}

/// A policy's part of its counter keys: [`POLICY_KEY_LEN`] base-62 digits, kept inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyKey([u8; POLICY_KEY_LEN]);

impl PolicyKey {
    /// The digits as text.
    pub(crate) fn as_str(&self) -> &str {
        // Only base-62 digits (ASCII) are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The policy key of `policy`: a hash of its id, measure and window fingerprint.
///
/// FNV-1a over the three texts (separated by a 0xFF byte, which UTF-8 never contains),
/// then MurmurHash3's 64-bit finalizer to spread FNV's weak low bits, reduced modulo 62^7.
/// Two policies of one action share counters only if their keys collide: one chance in
/// 3.5 trillion per pair. The result names live counters, so it must never change for an
/// unchanged policy: `a_policy_key_never_changes_for_an_unchanged_policy` pins it.
pub fn policy_key(policy: &Policy) -> PolicyKey {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let window = policy.spec.window.fingerprint();
    // A fourth part only for a scope other than the default, so that every policy keeps
    // the key it had before scopes existed.
    let mut scope = match policy.spec.scope.is_default() {
        true => String::new(),
        false => format!("s:{}", policy.spec.scope.names()),
    };
    if let Some(attribute) = &policy.spec.zone_attribute {
        if !scope.is_empty() {
            scope.push(';');
        }
        scope.push_str("z:");
        scope.push_str(attribute);
    }
    let mut parts = vec![
        policy.id.as_str().as_bytes(),
        policy.spec.measure.as_str().as_bytes(),
        window.as_bytes(),
    ];
    if !scope.is_empty() {
        parts.push(scope.as_bytes());
    }
    let mut hash = FNV_OFFSET;
    for (i, part) in parts.iter().enumerate() {
        let separator = (i > 0).then_some(&0xff_u8);
        for byte in separator.into_iter().chain(part.iter()) {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    let mut digits = [b'0'; POLICY_KEY_LEN];
    for digit in digits.iter_mut().rev() {
        // The remainder is below 62, so the index is in range.
        *digit = BASE62[(hash % 62) as usize];
        hash /= 62;
    }
    PolicyKey(digits)
}

/// Appends `period` (Unix seconds, clamped to 0 ..= 62^6 - 1) as [`PERIOD_LEN`] digits.
fn push_period(out: &mut String, period: i64) {
    let max = 62_i64.pow(PERIOD_LEN as u32) - 1;
    let mut rest = period.clamp(0, max) as u64;
    let mut digits = [b'0'; PERIOD_LEN];
    for digit in digits.iter_mut().rev() {
        *digit = BASE62[(rest % 62) as usize];
        rest /= 62;
    }
    for digit in digits {
        out.push(char::from(digit));
    }
}

/// The keys of one (action, subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectKeys {
    /// Its shard.
    pub(crate) shard: u16,
    /// `<prefix>{<shard>}`.
    tag: String,
    /// `<action>|<subject>`.
    tail: String,
}

/// The subject's part of a counter key under a scope naming more than the subject: the
/// other values in scope order, each as `<length in bytes>:<value>`, then the subject.
/// Injective: a policy's scope fixes how many values come before the subject.
fn push_budget(key: &mut String, budget: &Budget) {
    for (name, value) in budget.iter() {
        if name != crate::domain::SUBJECT_KEY {
            key.push_str(&value.len().to_string());
            key.push(':');
            key.push_str(value);
        }
    }
}

impl SubjectKeys {
    /// The keys of `subject` doing `action` under `prefix`.
    pub fn new(prefix: &str, action: &Action, subject: &Subject) -> Self {
        let shard = shard(action.as_str(), subject.as_str());
        let mut tail = String::with_capacity(action.as_str().len() + 1 + subject.as_str().len());
        tail.push_str(action.as_str());
        tail.push('|');
        tail.push_str(subject.as_str());
        Self {
            shard,
            tag: shard_prefix(prefix, shard),
            tail,
        }
    }

    /// The counter key of the policy with `policy_key`; `period` is the start (Unix s) of
    /// its calendar period.
    pub fn counter(&self, policy_key: &PolicyKey, period: Option<i64>) -> CounterKey {
        CounterKey::new(self.shard, self.counter_text(policy_key, period))
    }

    /// The text of [`SubjectKeys::counter`].
    fn counter_text(&self, policy_key: &PolicyKey, period: Option<i64>) -> String {
        let mut key =
            String::with_capacity(self.tag.len() + POLICY_KEY_LEN + PERIOD_LEN + self.tail.len());
        key.push_str(&self.tag);
        key.push_str(policy_key.as_str());
        if let Some(period) = period {
            push_period(&mut key, period);
        }
        key.push_str(&self.tail);
        key
    }

    /// The counter key of the policy with `policy_key` for `budget`, one of the subject's
    /// own (its scope names the subject): the default scope's is [`SubjectKeys::counter`].
    pub fn budget_counter(
        &self,
        policy_key: &PolicyKey,
        period: Option<i64>,
        budget: &Budget,
    ) -> CounterKey {
        if budget.is_subject_only() {
            return self.counter(policy_key, period);
        }
        let mut key = self.counter_text(policy_key, period);
        // Everything up to `<action>|`, then the budget's other values and the subject.
        let subject_len = self.tail.len() - self.tail.find('|').map_or(0, |bar| bar + 1);
        let subject = key.split_off(key.len() - subject_len);
        push_budget(&mut key, budget);
        key.push_str(&subject);
        CounterKey::new(self.shard, key)
    }

    /// The record of an idempotency key; `scope` separates consumes (`c`), holds (`h`) and
    /// refunds (`r`).
    pub(crate) fn idempotency(&self, scope: char, key: &str) -> String {
        format!("{}#i{scope}{}:{key}{}", self.tag, key.len(), self.tail)
    }
}

/// The part of `key` that Redis Cluster hashes: the text between the first `{` and the next
/// `}` if it is not empty, else the whole key (the same rule as Redis).
pub(crate) fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        let rest = &key[open + 1..];
        if let Some(len) = rest.find('}').filter(|&len| len > 0) {
            return &rest[..len];
        }
    }
    key
}

/// The policy key a counter's key names, or `None` for a key that is no counter (the
/// `#…` records and indexes of a shard).
pub(crate) fn counter_policy_key(key: &str) -> Option<&str> {
    let (_, rest) = key.split_once('}')?;
    match rest.starts_with('#') {
        true => None,
        false => rest.get(..POLICY_KEY_LEN),
    }
}

#[cfg(test)]
mod tests;
