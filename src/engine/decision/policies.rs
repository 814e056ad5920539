//! The in-process policy cache: what the consume path reads instead of the database.

use crate::domain::{Action, Budget, Override, OverrideSpec, Policy, PolicyId};
use crate::keys::{self, PolicyKey};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The policies of one action, and the overrides that apply to them.
#[derive(Debug, Default)]
pub(crate) struct ActionPolicies {
    /// Enabled policies, ordered by id (the order of answers and of counter keys).
    pub(crate) enabled: Vec<Arc<Policy>>,
    /// Each enabled policy's part of its counter keys, computed once here (same order).
    pub(crate) keys: Vec<PolicyKey>,
    /// Overrides by policy id, then budget text ([`Budget::text`]: the subject's, for the
    /// default scope).
    overrides: HashMap<PolicyId, HashMap<String, OverrideSpec>>,
}

impl ActionPolicies {
    /// The limit of `budget` under `policy` at `now`: an active override's, or the policy's.
    pub(crate) fn limit_for(&self, policy: &Policy, budget: &Budget, now: DateTime<Utc>) -> u64 {
        self.overrides
            .get(&policy.id)
            .and_then(|by_budget| by_budget.get(&budget.text()))
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
    /// The window of every policy, enabled or not (how far back a rebuild reads).
    windows: Vec<crate::domain::Window>,
    /// Whether some policy, enabled or not, has budgets shared by subjects (a scope without
    /// `subject`): a shard's counters then come from entries of every shard.
    shared_budgets: bool,
    /// A policy, enabled or not, with a lifetime window (it needs the whole ledger).
    lifetime: Option<PolicyId>,
}

/// Policies and overrides held in memory, rebuilt from the policy store on change
/// (`crate::policy::reload`).
///
/// Readers take a short read lock to clone one `Arc`; a reload builds the new snapshot
/// without that lock and swaps it in, so consumes never wait on the database.
#[derive(Debug, Default)]
pub(crate) struct PolicyCache {
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held for a whole reload, so reloads run one at a time: a reload that started
    /// earlier (and read older rows) can never swap its snapshot in after a later one.
    /// An async mutex because it is held across the database reads.
    reloading: tokio::sync::Mutex<()>,
}

impl PolicyCache {
    /// An empty cache; fill it ([`PolicyCache::install`]) before serving.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The policies of `action`, or `None` when the action has no policies at all.
    pub(crate) fn action(&self, action: &str) -> Option<Arc<ActionPolicies>> {
        let snapshot = self.current();
        snapshot.by_action.get(action).cloned()
    }

    /// The enabled policy whose counters carry `policy_key`, and its action.
    pub(crate) fn owner_of(&self, policy_key: &str) -> Option<(PolicyId, Action)> {
        let snapshot = self.current();
        snapshot.by_action.iter().find_map(|(action, policies)| {
            let at = policies
                .keys
                .iter()
                .position(|k| k.as_str() == policy_key)?;
            Some((policies.enabled[at].id.clone(), action.clone()))
        })
    }

    /// The enabled policies that record `totals` (`record`), of the actions `wanted` takes
    /// by id.
    pub(crate) fn recording_totals(&self, wanted: impl Fn(&Action) -> bool) -> Vec<PolicyId> {
        let snapshot = self.current();
        let mut ids: Vec<PolicyId> = snapshot
            .by_action
            .iter()
            .filter(|(action, _)| wanted(action))
            .flat_map(|(_, policies)| policies.enabled.iter())
            .filter(|policy| policy.spec.record == crate::domain::Record::Totals)
            .map(|policy| policy.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// How many policies and overrides are cached.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let snapshot = self.current();
        (snapshot.policies, snapshot.overrides)
    }

    /// The window of every policy, enabled or not.
    pub(crate) fn windows(&self) -> Vec<crate::domain::Window> {
        self.current().windows.clone()
    }

    /// A policy, enabled or not, whose lifetime window needs the whole ledger kept.
    pub(crate) fn lifetime_policy(&self) -> Option<PolicyId> {
        self.current().lifetime.clone()
    }

    /// Whether some policy, enabled or not, has budgets shared by subjects.
    pub(crate) fn has_shared_budgets(&self) -> bool {
        self.current().shared_budgets
    }

    /// When the cache was last rebuilt; `None` before the first reload.
    pub(crate) fn last_reload(&self) -> Option<DateTime<Utc>> {
        self.current().loaded_at
    }

    /// Takes the reload lock. Reloads run one at a time: hold the guard across reading
    /// the change marker, reading the rows and [`PolicyCache::install`], so that a reload
    /// that read older rows can never swap its snapshot in after a later one.
    pub(crate) async fn reload_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reloading.lock().await
    }

    /// The store's change marker the current snapshot was read at; `None` before the first.
    pub(crate) fn version(&self) -> Option<i64> {
        self.current().version
    }

    /// Swaps in a snapshot of `policies` and `overrides`, read after the change marker was
    /// `version` (so the rows are at least as new as the marker).
    pub(crate) fn install(&self, version: i64, policies: Vec<Policy>, overrides: Vec<Override>) {
        let mut snapshot = Snapshot {
            policies: policies.len(),
            overrides: overrides.len(),
            loaded_at: Some(Utc::now()),
            version: Some(version),
            ..Snapshot::default()
        };
        let mut building: HashMap<Action, ActionPolicies> = HashMap::new();
        let mut action_of: HashMap<PolicyId, Action> = HashMap::new();
        snapshot.windows = policies.iter().map(|p| p.spec.window).collect();
        snapshot.shared_budgets = policies.iter().any(|p| !p.spec.scope.has_subject());
        snapshot.lifetime = policies
            .iter()
            .find(|p| p.spec.window == crate::domain::Window::Lifetime)
            .map(|p| p.id.clone());
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
    }

    fn current(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a reader panicked; the snapshot itself is immutable.
        self.snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}
