//! Policy persistence (Postgres or SQLite behind one trait) and the in-process cache.
//!
//! The consume path never reads from here directly: it reads [`PolicyCache`], which is
//! rebuilt from the store after every change made through this instance, and kept in step
//! with changes made through other instances by [`Refresher`] (Postgres notifications,
//! and polling the shared change marker).

mod cache;
mod codec;
mod migrations;
mod notify;
mod refresh;
mod sql;
mod writes;

pub use cache::{ActionPolicies, PolicyCache};
pub use notify::{ChangeFeed, FeedEvent, CHANNEL};
pub use refresh::Refresher;
pub use sql::{connect, PostgresPolicyStore, SqlitePolicyStore};

use crate::domain::{Override, Policy, PolicyId, Subject};
use async_trait::async_trait;

/// Why the policy store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStoreError {
    /// The row to create exists already (duplicate id).
    #[error("a row with this key exists already")]
    Conflict,
    /// The database is unreachable or failed; worth retrying (503).
    #[error("policy store unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A stored row no longer parses: a bug or a hand edit (500).
    #[error("stored row is invalid: {0}")]
    Corrupt(String),
    /// Applying migrations failed.
    #[error("migrating the policy store failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
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
pub type StoreResult<T> = Result<T, PolicyStoreError>;

/// Where policies and overrides are kept.
#[async_trait]
pub trait PolicyStore: Send + Sync + 'static {
    /// Applies the embedded migrations (idempotent).
    async fn migrate(&self) -> StoreResult<()>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
    /// Every policy, ordered by id.
    async fn list_policies(&self) -> StoreResult<Vec<Policy>>;
    /// One policy.
    async fn get_policy(&self, id: &PolicyId) -> StoreResult<Option<Policy>>;
    /// Creates a policy; [`PolicyStoreError::Conflict`] if the id is taken.
    async fn insert_policy(&self, policy: &Policy) -> StoreResult<()>;
    /// Replaces a policy if its stored version is still `expected_version`; false otherwise.
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
}
