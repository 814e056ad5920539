//! The in-process policy cache: what the consume path reads instead of the database.

use super::{PolicyStore, StoreResult};
use crate::domain::{Action, OverrideSpec, Policy, PolicyId};
use crate::engine::keys::{self, PolicyKey};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The policies of one action, and the overrides that apply to them.
#[derive(Debug, Default)]
pub struct ActionPolicies {
    /// Enabled policies, ordered by id (the order of answers and of counter keys).
    pub enabled: Vec<Arc<Policy>>,
    /// Each enabled policy's part of its counter keys, computed once here (same order).
    pub keys: Vec<PolicyKey>,
    /// Overrides by policy id, then subject.
    overrides: HashMap<PolicyId, HashMap<String, OverrideSpec>>,
}

impl ActionPolicies {
    /// The limit for `subject` under `policy` at `now`: an active override's, or the policy's.
    pub fn limit_for(&self, policy: &Policy, subject: &str, now: DateTime<Utc>) -> u64 {
        self.overrides
            .get(&policy.id)
            .and_then(|by_subject| by_subject.get(subject))
            .filter(|o| o.expires_at.is_none_or(|at| now < at))
            .map_or(policy.spec.limit.get(), |o| o.limit.get())
    }
}

/// A consistent view of all policies, swapped whole on reload.
#[derive(Debug, Default)]
struct Snapshot {
    by_action: HashMap<Action, Arc<ActionPolicies>>,
    policies: usize,
    overrides: usize,
    /// Wall-clock time of the rebuild, for monitoring (not quota math, hence no `Clock`).
    loaded_at: Option<DateTime<Utc>>,
    /// The store's change marker read just before the rows; `None` before the first load.
    version: Option<i64>,
}

/// Policies and overrides held in memory, rebuilt from the [`PolicyStore`] on change.
///
/// Readers take a short read lock to clone one `Arc`; a reload builds the new snapshot
/// without that lock and swaps it in, so consumes never wait on the database.
#[derive(Debug, Default)]
pub struct PolicyCache {
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held for a whole reload, so reloads run one at a time: a reload that started
    /// earlier (and read older rows) can never swap its snapshot in after a later one.
    /// An async mutex because it is held across the database reads.
    reloading: tokio::sync::Mutex<()>,
}

impl PolicyCache {
    /// An empty cache; call [`PolicyCache::reload`] before serving.
    pub fn new() -> Self {
        Self::default()
    }

    /// The policies of `action`, or `None` when the action has no policies at all.
    pub fn action(&self, action: &str) -> Option<Arc<ActionPolicies>> {
        let snapshot = self.current();
        snapshot.by_action.get(action).cloned()
    }

    /// How many policies and overrides are cached.
    pub fn sizes(&self) -> (usize, usize) {
        let snapshot = self.current();
        (snapshot.policies, snapshot.overrides)
    }

    /// When the cache was last rebuilt; `None` before the first reload.
    pub fn last_reload(&self) -> Option<DateTime<Utc>> {
        self.current().loaded_at
    }

    /// Rebuilds the cache from the store.
    pub async fn reload(&self, store: &dyn PolicyStore) -> StoreResult<()> {
        let _one_at_a_time = self.reloading.lock().await;
        let version = store.change_version().await?;
        self.rebuild(store, version).await
    }

    /// Rebuilds the cache only if the store's change marker moved since the last load;
    /// true if it did. One cheap query when nothing changed.
    pub async fn refresh_if_changed(&self, store: &dyn PolicyStore) -> StoreResult<bool> {
        let _one_at_a_time = self.reloading.lock().await;
        let version = store.change_version().await?;
        if self.current().version == Some(version) {
            return Ok(false);
        }
        self.rebuild(store, version).await?;
        Ok(true)
    }

    /// Reads every row and swaps the new snapshot in; the caller holds `reloading` and
    /// read `version` before calling, so the rows are at least as new as the marker.
    async fn rebuild(&self, store: &dyn PolicyStore, version: i64) -> StoreResult<()> {
        let policies = store.list_policies().await?;
        let overrides = store.list_overrides(None).await?;
        let mut snapshot = Snapshot {
            policies: policies.len(),
            overrides: overrides.len(),
            loaded_at: Some(Utc::now()),
            version: Some(version),
            ..Snapshot::default()
        };
        let mut building: HashMap<Action, ActionPolicies> = HashMap::new();
        let mut action_of: HashMap<PolicyId, Action> = HashMap::new();
        for policy in policies {
            action_of.insert(policy.id.clone(), policy.spec.action.clone());
            let entry = building.entry(policy.spec.action.clone()).or_default();
            if policy.spec.enabled {
                entry.keys.push(keys::policy_key(&policy));
                entry.enabled.push(Arc::new(policy));
            }
        }
        for item in overrides {
            let Some(entry) = action_of
                .get(&item.policy_id)
                .and_then(|a| building.get_mut(a))
            else {
                continue;
            };
            entry
                .overrides
                .entry(item.policy_id)
                .or_default()
                .insert(item.subject.as_str().to_owned(), item.spec);
        }
        snapshot.by_action = building
            .into_iter()
            .map(|(action, policies)| (action, Arc::new(policies)))
            .collect();
        let mut guard = self
            .snapshot
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *guard = Arc::new(snapshot);
        Ok(())
    }

    fn current(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a reader panicked; the snapshot itself is immutable.
        self.snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Measure, Mode, PolicySpec, Quantity, Window};
    use chrono::TimeZone;

    fn policy(id: &str) -> Policy {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
            .single()
            .expect("valid instant");
        Policy {
            id: PolicyId::parse("id", id).expect("valid id"),
            spec: PolicySpec {
                action: Action::parse("action", "a").expect("valid action"),
                measure: Measure::Count,
                unit: None,
                limit: Quantity::parse("limit", 10).expect("valid limit"),
                window: Window::token_bucket(60).expect("valid window"),
                mode: Mode::Enforce,
                enabled: true,
                ledger_denials: false,
                description: String::new(),
            },
            created_at: at,
            updated_at: at,
            version: 1,
        }
    }

    #[tokio::test]
    async fn a_refresh_reloads_only_when_a_write_moved_the_change_marker() {
        let file = std::env::temp_dir().join(format!(
            "quota-ledger-cache-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = crate::policy::connect(&format!("sqlite://{}", file.display()))
            .await
            .expect("opening a SQLite file");
        store.migrate().await.expect("migrating");
        let cache = PolicyCache::new();
        cache.reload(store.as_ref()).await.expect("loading");
        assert!(!cache
            .refresh_if_changed(store.as_ref())
            .await
            .expect("reading the marker"));

        // Another instance's write: this cache did not reload after it.
        store.insert_policy(&policy("p")).await.expect("inserting");
        assert_eq!(cache.sizes(), (0, 0));
        assert!(cache
            .refresh_if_changed(store.as_ref())
            .await
            .expect("reading the marker"));
        assert_eq!(cache.sizes(), (1, 0));
        assert!(cache.action("a").is_some());
        assert!(!cache
            .refresh_if_changed(store.as_ref())
            .await
            .expect("reading the marker"));

        // A write that changes nothing (a stale version) leaves the marker alone.
        assert!(!store
            .update_policy(&policy("p"), 7)
            .await
            .expect("updating"));
        assert!(!cache
            .refresh_if_changed(store.as_ref())
            .await
            .expect("reading the marker"));
        drop(std::fs::remove_file(file));
    }
}
