//! The ledger-stream port: where the Redis consume script appends ledger entries, in the
//! same atomic step as the charge, for the [drain](crate::engine::pipeline::drain) to move into SQL.
//!
//! The Redis adapter (`crate::counters::redis`) implements it over one stream per shard
//! and a consumer group; the drain, a verify and the voider only need these operations,
//! so they can be tested without Redis.

use crate::engine::store::StoreError;
use async_trait::async_trait;

/// One stream entry: its id in the stream and the encoded ledger entry
/// (see [`codec::decode_entry`](crate::engine::codec::decode_entry)).
pub type StreamEntry = (String, String);

/// Which entries to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read<'a> {
    /// Entries delivered to this consumer but not acknowledged (after a failed insert),
    /// with ids after this one (`"0"`: from the first).
    PendingAfter(&'a str),
    /// Entries never delivered to anyone.
    New,
}

/// The per-shard ledger streams, read through one consumer group shared by every instance.
#[async_trait]
pub trait LedgerStream: Send + Sync + 'static {
    /// Up to `count` entries of `stream` for `consumer`.
    async fn read_group(
        &self,
        stream: &str,
        consumer: &str,
        count: usize,
        read: Read<'_>,
    ) -> Result<Vec<StreamEntry>, StoreError>;

    /// Takes over up to `count` entries idle for at least `min_idle_ms` (their consumer died).
    async fn claim_idle(
        &self,
        stream: &str,
        consumer: &str,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError>;

    /// How many entries `stream` holds; all of them wait to be moved (moved ones are deleted).
    async fn stream_len(&self, stream: &str) -> Result<u64, StoreError>;

    /// The id of the newest entry `stream` holds (`None` when it is empty).
    async fn last_id(&self, stream: &str) -> Result<Option<String>, StoreError>;

    /// The id of the oldest entry `stream` holds: the oldest still waiting to be moved
    /// (`None` when it is empty).
    async fn first_id(&self, stream: &str) -> Result<Option<String>, StoreError>;

    /// Up to `count` entries of `stream` appended from `from_ms` to `to_ms` (by Redis's
    /// clock), oldest first.
    async fn range(
        &self,
        stream: &str,
        from_ms: i64,
        to_ms: i64,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError>;

    /// Acknowledges and deletes entries that are safely in SQL.
    async fn ack(&self, stream: &str, ids: &[String]) -> Result<(), StoreError>;

    /// The write generation of `stream`'s shard now (`None` when it has none yet): read
    /// after a batch of it, at least that of every entry in the batch.
    async fn generation(&self, stream: &str) -> Result<Option<u64>, StoreError>;

    /// Raises the floors of the shards' write generations that the store's scripts check
    /// to `floors` (`(shard, generation)`, as the ledger recorded them).
    fn raise_floors(&self, floors: &[(u16, u64)]);
}
