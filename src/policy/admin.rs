//! Changes to policies and overrides made through this instance: each is written to the
//! store and, when it changed something, followed by a reload of this instance's cache, so
//! that the next consume here already enforces it. Other instances catch up through their
//! [`Refresher`](super::Refresher).

use super::Caches;
use super::{PolicyStore, StoreResult};
use crate::access::KeyRecord;
use crate::domain::{Override, Policy, PolicyId, Subject};
use chrono::{DateTime, Utc};

/// The write side of the policy module: the store's writes, each followed by a cache reload.
///
/// It borrows what it needs, so it is built per use (`AppState::policy_admin`) at no cost.
#[derive(Clone, Copy)]
pub(crate) struct PolicyAdmin<'a> {
    store: &'a dyn PolicyStore,
    caches: &'a Caches,
}

impl<'a> PolicyAdmin<'a> {
    /// Writes to `store` and reloads `caches` (those this instance's engine and gate read).
    pub(crate) fn new(store: &'a dyn PolicyStore, caches: &'a Caches) -> Self {
        Self { store, caches }
    }

    /// Creates a policy; errors as [`PolicyStore::insert_policy`] (a taken id, a full action).
    pub(crate) async fn create(&self, policy: &Policy) -> StoreResult<()> {
        self.store.insert_policy(policy).await?;
        self.reload().await;
        Ok(())
    }

    /// Replaces a policy still at `expected_version`; false (nothing written) otherwise.
    pub(crate) async fn replace(
        &self,
        policy: &Policy,
        expected_version: i64,
    ) -> StoreResult<bool> {
        let replaced = self.store.update_policy(policy, expected_version).await?;
        Ok(self.reload_if(replaced).await)
    }

    /// Deletes a policy still at `expected_version`, with its overrides; false otherwise.
    pub(crate) async fn delete(&self, id: &PolicyId, expected_version: i64) -> StoreResult<bool> {
        let deleted = self.store.delete_policy(id, expected_version).await?;
        Ok(self.reload_if(deleted).await)
    }

    /// Creates or replaces an override.
    pub(crate) async fn save_override(&self, item: &Override) -> StoreResult<()> {
        self.store.upsert_override(item).await?;
        self.reload().await;
        Ok(())
    }

    /// Deletes an override; false if there was none.
    pub(crate) async fn delete_override(
        &self,
        policy: &PolicyId,
        subject: &Subject,
    ) -> StoreResult<bool> {
        let deleted = self.store.delete_override(policy, subject).await?;
        Ok(self.reload_if(deleted).await)
    }

    /// Creates an API key (the record holds its hash, never its secret).
    pub(crate) async fn create_key(&self, key: &KeyRecord) -> StoreResult<()> {
        self.store.insert_key(key).await?;
        self.reload().await;
        Ok(())
    }

    /// Revokes key `id` at `at`; the key afterwards and whether this call revoked it,
    /// `None` if there is no such key.
    pub(crate) async fn revoke_key(
        &self,
        id: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<(KeyRecord, bool)>> {
        let key = self.store.revoke_key(id, at).await?;
        if key.as_ref().is_some_and(|(_, revoked)| *revoked) {
            self.reload().await;
        }
        Ok(key)
    }

    /// `changed`, once the cache is rebuilt if it is true (a write that changed nothing
    /// leaves the cache as it was).
    async fn reload_if(&self, changed: bool) -> bool {
        if changed {
            self.reload().await;
        }
        changed
    }

    /// Rebuilds the cache after a change. A failure is logged, not returned: the change is
    /// stored already, and the refresher's next poll reloads anyway.
    async fn reload(&self) {
        if let Err(error) = super::reload(self.caches, self.store).await {
            tracing::error!(
                error = format!("{error:#}"),
                "reloading the policy cache failed"
            );
        }
    }
}
