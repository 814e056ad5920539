//! How a change made through one instance is announced to the others.
//!
//! Postgres announces it: the writing transaction runs `pg_notify` on [`CHANNEL`], which
//! Postgres delivers at commit to every instance that `LISTEN`s. SQLite cannot: other
//! instances see the change when they next poll the change marker.

use super::StoreResult;
use crate::db::Sql;
use async_trait::async_trait;
use sqlx::postgres::PgListener;

/// The Postgres notification channel of policy and override changes.
pub(crate) const CHANNEL: &str = "quota_policies";

/// What a [`ChangeFeed`] heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FeedEvent {
    /// Some instance committed a change to policies or overrides.
    Changed,
    /// The connection was lost: announcements may have been missed; subscribe again.
    Lost,
}

/// A live subscription to the change announcements of every instance (Postgres `LISTEN`).
///
/// It holds one pooled connection for as long as it lives.
#[derive(Debug)]
pub(crate) struct ChangeFeed {
    listener: PgListener,
}

impl ChangeFeed {
    /// Waits for the next announcement (or for the connection to drop).
    pub(crate) async fn next(&mut self) -> StoreResult<FeedEvent> {
        Ok(match self.listener.try_recv().await? {
            Some(_) => FeedEvent::Changed,
            None => FeedEvent::Lost,
        })
    }
}

/// How a database tells the other instances about a change: the one part of the policy
/// stores that differs between Postgres and SQLite.
#[async_trait]
pub(super) trait Announce: Sql {
    /// Announces change `version` to the listening instances when the transaction commits.
    async fn announce_change(conn: &mut Self::Connection, version: i64) -> sqlx::Result<()>;

    /// Starts listening to the changes of every instance, if the database can tell them.
    async fn subscribe_to_changes(pool: &sqlx::Pool<Self>) -> StoreResult<Option<ChangeFeed>>;
}

#[async_trait]
impl Announce for sqlx::Postgres {
    /// Runs `pg_notify` on [`CHANNEL`]; Postgres delivers it at commit.
    async fn announce_change(conn: &mut sqlx::PgConnection, version: i64) -> sqlx::Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(version.to_string())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Starts listening on [`CHANNEL`] on a connection of its own.
    async fn subscribe_to_changes(pool: &sqlx::PgPool) -> StoreResult<Option<ChangeFeed>> {
        let mut listener = PgListener::connect_with(pool).await?;
        // On a lost connection, report it rather than reconnect inside `try_recv`: the
        // caller reconnects with its own backoff and catches up on what it missed.
        listener.eager_reconnect(false);
        listener.listen(CHANNEL).await?;
        Ok(Some(ChangeFeed { listener }))
    }
}

#[async_trait]
impl Announce for sqlx::Sqlite {
    /// SQLite has no notifications: other instances find the change by polling.
    async fn announce_change(
        _conn: &mut sqlx::SqliteConnection,
        _version: i64,
    ) -> sqlx::Result<()> {
        Ok(())
    }

    /// SQLite cannot announce changes, so there is nothing to subscribe to.
    async fn subscribe_to_changes(_pool: &sqlx::SqlitePool) -> StoreResult<Option<ChangeFeed>> {
        Ok(None)
    }
}
