//! Every API key, in memory, by the hash of its secret: what authorizing a request reads.

use super::key::{unhex, KeyRecord, Operations};
use crate::domain::{ActionGlob, ActionSet};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// What an accepted key may do, and where its use is noted.
#[derive(Debug)]
pub(crate) struct Grant {
    /// The key's id.
    pub(crate) id: String,
    /// The key's name.
    pub(crate) name: String,
    /// The actions it may act on.
    pub(crate) actions: ActionSet,
    /// The operations it may use.
    pub(crate) operations: Operations,
    /// When it stops being accepted.
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// True once revoked: still known, so that a refusal can say why.
    pub(crate) revoked: bool,
    /// The last second (Unix) it was accepted in; shared across reloads.
    used: Arc<AtomicI64>,
}

impl Grant {
    /// Notes that the key was accepted at `now` (one relaxed store per second at most).
    pub(crate) fn touch(&self, now: DateTime<Utc>) {
        let second = now.timestamp();
        if self.used.load(Ordering::Relaxed) < second {
            self.used.store(second, Ordering::Relaxed);
        }
    }
}

/// The keys of the last reload, and when each was last used.
///
/// A std `RwLock` around an `Arc`: a reload swaps the map, a request clones one `Arc` out
/// of it under the read lock and never holds the lock across an await.
#[derive(Debug, Default)]
pub(crate) struct KeyRing {
    by_hash: RwLock<Arc<HashMap<[u8; 32], Arc<Grant>>>>,
    /// Whether any key (revoked and expired ones too) exists: the quota endpoints are
    /// open only while none does and no client token is set.
    any: AtomicBool,
    /// Per key id, the last second it was accepted in, and the last second written down.
    uses: Mutex<HashMap<String, (Arc<AtomicI64>, i64)>>,
}

impl KeyRing {
    /// An empty ring.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Replaces every key with `records`; a record whose hash does not parse is skipped
    /// and logged (a hand edit), never accepted.
    pub(crate) fn install(&self, records: Vec<KeyRecord>) {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by_hash = HashMap::with_capacity(records.len());
        let any = !records.is_empty();
        for record in records {
            let Some(hash) = unhex(&record.secret_hash) else {
                tracing::error!(
                    key_id = record.id,
                    "an API key's stored hash is not a SHA-256 digest; the key is refused"
                );
                continue;
            };
            let stored = record.last_used_at.map_or(0, |at| at.timestamp());
            let (used, written) = uses
                .entry(record.id.clone())
                .or_insert_with(|| (Arc::new(AtomicI64::new(stored)), stored));
            *written = (*written).max(stored);
            used.fetch_max(stored, Ordering::Relaxed);
            let grant = Grant {
                actions: actions_of(record.actions),
                operations: record.operations,
                expires_at: record.expires_at,
                revoked: record.revoked_at.is_some(),
                used: used.clone(),
                id: record.id,
                name: record.name,
            };
            by_hash.insert(hash, Arc::new(grant));
        }
        *self.by_hash.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(by_hash);
        self.any.store(any, Ordering::Release);
    }

    /// The key whose secret hashes to `hash`, if any.
    pub(crate) fn get(&self, hash: &[u8; 32]) -> Option<Arc<Grant>> {
        let map = self.by_hash.read().unwrap_or_else(PoisonError::into_inner);
        map.get(hash).cloned()
    }

    /// Whether any key exists, revoked and expired ones included.
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// The keys used since the last call, each with the last second it was used in; the
    /// caller writes them down (and calls [`Self::written`] once they are).
    pub(crate) fn unwritten_uses(&self) -> Vec<(String, DateTime<Utc>)> {
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        uses.iter()
            .filter_map(|(id, (used, written))| {
                let second = used.load(Ordering::Relaxed);
                (second > *written)
                    .then(|| DateTime::from_timestamp(second, 0).map(|at| (id.clone(), at)))
                    .flatten()
            })
            .collect()
    }

    /// Notes that `uses` were written down.
    pub(crate) fn written(&self, uses: &[(String, DateTime<Utc>)]) {
        let mut known = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, at) in uses {
            if let Some((_, written)) = known.get_mut(id) {
                *written = (*written).max(at.timestamp());
            }
        }
    }
}

fn actions_of(globs: Vec<ActionGlob>) -> ActionSet {
    ActionSet::Matching(globs.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::key::{hash_of, new_secret, Operation};
    use chrono::TimeZone;

    fn record(id: &str, secret_hash: String, revoked: bool) -> KeyRecord {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 27, 12, 0, 0)
            .single()
            .expect("an instant");
        KeyRecord {
            id: id.to_owned(),
            name: "sms backend".to_owned(),
            prefix: "qlk_abcdefgh".to_owned(),
            secret_hash,
            actions: vec![ActionGlob::parse("actions[0]", "sms.*").expect("a glob")],
            operations: [Operation::Consume].into_iter().collect(),
            expires_at: None,
            created_at: at,
            revoked_at: revoked.then_some(at),
            last_used_at: None,
        }
    }

    #[test]
    fn a_key_is_found_by_its_hash_and_its_uses_are_written_down_once() {
        let ring = KeyRing::new();
        assert!(!ring.any());
        let secret = new_secret();
        ring.install(vec![record("key_a", secret.secret_hash.clone(), false)]);
        assert!(ring.any());
        let grant = ring.get(&hash_of(&secret.key)).expect("the key is known");
        assert!(grant.actions.contains_str("sms.send") && !grant.actions.contains_str("transfer"));
        assert!(ring.get(&hash_of("qlk_other")).is_none());

        let at = Utc
            .with_ymd_and_hms(2026, 11, 27, 13, 0, 0)
            .single()
            .expect("an instant");
        grant.touch(at);
        let uses = ring.unwritten_uses();
        assert_eq!(uses, vec![("key_a".to_owned(), at)]);
        ring.written(&uses);
        assert!(ring.unwritten_uses().is_empty(), "written down once");

        // A reload keeps what was noted: the same counter serves the new grant.
        ring.install(vec![record("key_a", secret.secret_hash, true)]);
        let grant = ring
            .get(&hash_of(&secret.key))
            .expect("revoked keys stay known");
        assert!(grant.revoked);
        grant.touch(at + chrono::Duration::seconds(1));
        assert_eq!(ring.unwritten_uses().len(), 1);
    }
}
