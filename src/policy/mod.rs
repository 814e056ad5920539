//! Policy persistence (Postgres or SQLite behind one trait), and what keeps the engine's
//! in-process cache in step with it.
//!
//! The consume path never reads from here directly: it reads the engine's
//! [`PolicyCache`](crate::engine::decision::policies::PolicyCache), which is
//! rebuilt from the store after every change made through this instance ([`PolicyAdmin`]),
//! and kept in step
//! with changes made through other instances by [`Refresher`] (Postgres notifications,
//! and polling the shared change marker).

mod admin;
mod codec;
mod keys;
mod notify;
mod refresh;
mod sql;
mod writes;

pub(crate) use admin::PolicyAdmin;
pub(crate) use notify::{ChangeFeed, FeedEvent};
pub(crate) use refresh::Refresher;
pub(crate) use sql::connect;

use crate::access::{KeyRecord, KeyRing};
use crate::domain::{Action, Override, Policy, PolicyId, Subject};
use crate::engine::decision::policies::PolicyCache;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::Arc;

pub use crate::db::formats::Gate;

/// The most policies one action may have: each consume evaluates all of them in one script.
pub(crate) const MAX_POLICIES_PER_ACTION: usize = 32;

/// Why the policy store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PolicyStoreError {
    /// The row to create exists already (duplicate id).
    #[error("a row with this key exists already")]
    Conflict,
    /// The write would give `action` more than [`MAX_POLICIES_PER_ACTION`] policies; nothing
    /// was written (409).
    #[error(
        "action '{action}' has {} policies already, the most one action may have",
        MAX_POLICIES_PER_ACTION
    )]
    ActionFull {
        /// The action that has no room left.
        action: Action,
    },
    /// An instance of version `version`, which does not enforce API keys nor read
    /// anchored windows, is live: no key and no such policy is created, and no hold
    /// over-captured, until every instance runs a build that does (409).
    #[error(
        "an instance of version {version} is running, and it would neither enforce API keys \
         nor read velocity controls (calendar anchors, year, request and lifetime windows, \
         match_not, over-captured commits): upgrade every instance first"
    )]
    Outdated {
        /// The version the outdated instance announced.
        version: String,
    },
    /// The database is unreachable or failed; worth retrying (503).
    #[error("policy store unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A stored row no longer parses: a bug or a hand edit (500).
    #[error("stored row is invalid: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for PolicyStoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(db) if db.is_unique_violation() => Self::Conflict,
            _ => Self::Unavailable(error),
        }
    }
}

/// Shorthand for policy store results.
pub(crate) type StoreResult<T> = Result<T, PolicyStoreError>;

/// Where policies and overrides are kept.
#[async_trait]
pub(crate) trait PolicyStore: Send + Sync + 'static {
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
    /// Every policy, ordered by id.
    async fn list_policies(&self) -> StoreResult<Vec<Policy>>;
    /// One policy.
    async fn get_policy(&self, id: &PolicyId) -> StoreResult<Option<Policy>>;
    /// Creates a policy; [`PolicyStoreError::Conflict`] if the id is taken,
    /// [`PolicyStoreError::ActionFull`] if its action has no room left. Writes run one at a
    /// time across instances, so concurrent creates never overfill an action.
    async fn insert_policy(&self, policy: &Policy) -> StoreResult<()>;
    /// Replaces a policy if its stored version is still `expected_version`; false otherwise.
    /// [`PolicyStoreError::ActionFull`] if the action it names has
    /// [`MAX_POLICIES_PER_ACTION`] other policies.
    async fn update_policy(&self, policy: &Policy, expected_version: i64) -> StoreResult<bool>;
    /// Deletes a policy (and its overrides) if its version is `expected_version`; false otherwise.
    async fn delete_policy(&self, id: &PolicyId, expected_version: i64) -> StoreResult<bool>;
    /// Every override (of one policy, or of all), ordered by policy id and subject.
    async fn list_overrides(&self, policy: Option<&PolicyId>) -> StoreResult<Vec<Override>>;
    /// One override.
    async fn get_override(
        &self,
        policy: &PolicyId,
        subject: &Subject,
    ) -> StoreResult<Option<Override>>;
    /// Creates or replaces an override.
    async fn upsert_override(&self, item: &Override) -> StoreResult<()>;
    /// Deletes an override; false if there was none.
    async fn delete_override(&self, policy: &PolicyId, subject: &Subject) -> StoreResult<bool>;
    /// The change marker: a number that every write above moves, in its own transaction.
    ///
    /// One cheap read tells an instance whether its cache is stale.
    async fn change_version(&self) -> StoreResult<i64>;
    /// Subscribes to the changes announced by every instance; `None` when the store
    /// cannot announce them (SQLite), which leaves polling [`Self::change_version`].
    async fn subscribe(&self) -> StoreResult<Option<ChangeFeed>>;
    /// Every API key, revoked and expired ones too, oldest first.
    async fn list_keys(&self) -> StoreResult<Vec<KeyRecord>>;
    /// Creates an API key: a change, like a policy's. [`PolicyStoreError::Conflict`] if
    /// its id or its hash is taken, [`PolicyStoreError::Outdated`] while an instance that
    /// would not enforce it was seen within [`crate::db::formats::LIVE_FOR`] of its `created_at`.
    async fn insert_key(&self, key: &KeyRecord) -> StoreResult<()>;
    /// Revokes key `id` at `at` (a change), unless it was revoked before; the key as it
    /// stands afterwards and whether this call revoked it, `None` if there is no such key.
    async fn revoke_key(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<(KeyRecord, bool)>>;
    /// Writes down when keys were last used. Not a change: no instance reloads for it.
    async fn note_key_uses(&self, uses: &[(String, DateTime<Utc>)]) -> StoreResult<()>;
    /// [`PolicyStoreError::Outdated`] while an instance seen within
    /// [`crate::db::formats::LIVE_FOR`] of `now` keeps `gate` closed (`crate::db::formats`).
    async fn ensure_open(&self, gate: Gate, now: DateTime<Utc>) -> StoreResult<()>;
}

/// What a reload fills: the engine's policy cache, and the API keys.
#[derive(Debug, Clone)]
pub(crate) struct Caches {
    /// Policies and overrides, which the engine reads.
    pub(crate) policies: Arc<PolicyCache>,
    /// API keys, which the gate reads.
    pub(crate) keys: Arc<KeyRing>,
}

impl Caches {
    /// Empty caches, filled by the first [`reload`].
    pub(crate) fn new() -> Self {
        Self {
            policies: Arc::new(PolicyCache::new()),
            keys: Arc::new(KeyRing::new()),
        }
    }
}

/// Rebuilds `cache` from `store`.
pub(crate) async fn reload(caches: &Caches, store: &dyn PolicyStore) -> StoreResult<()> {
    let _one_at_a_time = caches.policies.reload_lock().await;
    let version = store.change_version().await?;
    install(caches, store, version).await
}

/// Rebuilds `cache` only if the store's change marker moved since the last load; true if
/// it did. One cheap query when nothing changed.
pub(crate) async fn refresh_if_changed(
    caches: &Caches,
    store: &dyn PolicyStore,
) -> StoreResult<bool> {
    let _one_at_a_time = caches.policies.reload_lock().await;
    let version = store.change_version().await?;
    if caches.policies.version() == Some(version) {
        return Ok(false);
    }
    install(caches, store, version).await?;
    Ok(true)
}

/// Reads every row and swaps the new snapshot in; the caller holds the reload lock and
/// read `version` before calling.
async fn install(caches: &Caches, store: &dyn PolicyStore, version: i64) -> StoreResult<()> {
    let policies = store.list_policies().await?;
    let overrides = store.list_overrides(None).await?;
    let keys = store.list_keys().await?;
    // Keys first: the policy cache's version says the whole reload is done.
    caches.keys.install(keys);
    caches.policies.install(version, policies, overrides);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::MAX_POLICIES_PER_ACTION;
    use super::{refresh_if_changed, reload, Caches, PolicyAdmin, PolicyStore, PolicyStoreError};
    use crate::domain::{Action, Policy, PolicyId};
    use crate::domain::{Measure, PolicySpec, Window};
    use chrono::TimeZone;
    use chrono::Utc;
    use std::path::PathBuf;
    use std::sync::Arc;

    /// A migrated store in a fresh SQLite file, and the file (to remove at the end).
    pub(crate) async fn sqlite_store(name: &str) -> (Arc<dyn PolicyStore>, PathBuf) {
        let file = std::env::temp_dir().join(format!(
            "quota-ledger-{name}-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let url = format!("sqlite://{}", file.display());
        crate::db::migrate_url(&url).await.expect("migrating");
        let store = crate::policy::connect(&url)
            .await
            .expect("opening a SQLite file");
        (store, file)
    }

    fn policy(id: &str) -> Policy {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
            .single()
            .expect("valid instant");
        Policy {
            id: PolicyId::parse("id", id).expect("valid id"),
            spec: PolicySpec::example(
                "a",
                Measure::Count,
                10,
                Window::token_bucket(60).expect("valid window"),
            ),
            created_at: at,
            updated_at: at,
            version: 1,
        }
    }

    #[tokio::test]
    async fn a_refresh_reloads_only_when_a_write_moved_the_change_marker() {
        let (store, file) = sqlite_store("cache").await;
        let caches = Caches::new();
        reload(&caches, store.as_ref()).await.expect("loading");
        assert!(!refresh_if_changed(&caches, store.as_ref())
            .await
            .expect("reading the marker"));

        // Another instance's write: this cache did not reload after it.
        store.insert_policy(&policy("p")).await.expect("inserting");
        assert_eq!(caches.policies.sizes(), (0, 0));
        assert!(refresh_if_changed(&caches, store.as_ref())
            .await
            .expect("reading the marker"));
        assert_eq!(caches.policies.sizes(), (1, 0));
        assert!(caches.policies.action("a").is_some());
        assert!(!refresh_if_changed(&caches, store.as_ref())
            .await
            .expect("reading the marker"));

        // A write that changes nothing (a stale version) leaves the marker alone.
        assert!(!store
            .update_policy(&policy("p"), 7)
            .await
            .expect("updating"));
        assert!(!refresh_if_changed(&caches, store.as_ref())
            .await
            .expect("reading the marker"));
        drop(std::fs::remove_file(file));
    }

    #[tokio::test]
    async fn the_store_refuses_a_policy_past_the_most_an_action_may_have_and_changes_nothing() {
        let (store, file) = sqlite_store("full").await;
        for i in 0..MAX_POLICIES_PER_ACTION {
            store
                .insert_policy(&policy(&format!("p{i}")))
                .await
                .expect("inserting");
        }
        let marker = store.change_version().await.expect("reading the marker");
        let refused = store.insert_policy(&policy("one-too-many")).await;
        assert!(
            matches!(&refused, Err(PolicyStoreError::ActionFull { action }) if action.as_str() == "a"),
            "{refused:?}"
        );
        let mut elsewhere = policy("elsewhere");
        elsewhere.spec.action = Action::parse("action", "b").expect("valid action");
        store.insert_policy(&elsewhere).await.expect("inserting");
        let mut moved = elsewhere.clone();
        moved.spec.action = Action::parse("action", "a").expect("valid action");
        moved.version = 2;
        let refused = store.update_policy(&moved, 1).await;
        assert!(
            matches!(refused, Err(PolicyStoreError::ActionFull { .. })),
            "{refused:?}"
        );
        let mut same = policy("p0");
        same.version = 2;
        assert!(
            store.update_policy(&same, 1).await.expect("updating"),
            "replacing one of the policies of a full action is fine"
        );

        let policies = store.list_policies().await.expect("listing");
        assert_eq!(policies.len(), MAX_POLICIES_PER_ACTION + 1);
        assert!(policies.iter().all(|p| p.id.as_str() != "one-too-many"));
        assert_eq!(
            store.change_version().await.expect("reading the marker"),
            marker + 2,
            "only the two writes that went through moved the marker"
        );
        drop(std::fs::remove_file(file));
    }

    #[tokio::test]
    async fn a_change_made_through_policy_admin_is_in_this_cache_at_once() {
        let (store, file) = sqlite_store("admin").await;
        let caches = Caches::new();
        reload(&caches, store.as_ref()).await.expect("loading");
        let admin = PolicyAdmin::new(store.as_ref(), &caches);

        admin.create(&policy("p")).await.expect("creating");
        assert!(
            caches.policies.action("a").is_some(),
            "created, then reloaded"
        );
        let mut replaced = policy("p");
        replaced.spec.action = Action::parse("action", "b").expect("valid action");
        replaced.version = 2;
        assert!(admin.replace(&replaced, 1).await.expect("replacing"));
        assert!(caches.policies.action("a").is_none() && caches.policies.action("b").is_some());
        assert!(!admin.delete(&replaced.id, 1).await.expect("deleting"));
        assert!(
            caches.policies.action("b").is_some(),
            "a stale delete deletes nothing"
        );
        assert!(admin.delete(&replaced.id, 2).await.expect("deleting"));
        assert!(caches.policies.action("b").is_none());
        drop(std::fs::remove_file(file));
    }
}
