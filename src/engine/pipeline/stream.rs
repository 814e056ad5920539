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

/// A shard's consumes recorded in the ledger's totals, handed to the drain to move
/// (`move.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moving {
    /// The shard's write generation after the hand-out: at least that of every consume in
    /// it.
    pub generation: u64,
    /// The hash's fields and values: `#` and the content's id, then each consume's
    /// allowed entry id (with `!` after it for a denial) and its encoded entry.
    pub fields: Vec<(String, String)>,
    /// A move not ended before, handed out again (the shard's waiting hash is behind it).
    pub resumed: bool,
}

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

    /// Hands out `shard`'s consumes recorded in the ledger's totals, to move into SQL (a
    /// move not ended is handed out again, whole); `None` when none waits. Once the
    /// replicas the store requires hold them, like a stream's entries.
    async fn move_totals(&self, shard: u16) -> Result<Option<Moving>, StoreError>;

    /// Ends the move of the content `content` names (its `#`) once its rows are in SQL:
    /// it leaves Redis (unless a verify holds deletions).
    async fn moved_totals(&self, shard: u16, content: &str) -> Result<(), StoreError>;

    /// How many consumes recorded in the ledger's totals wait in `shard`, moving or not.
    async fn totals_len(&self, shard: u16) -> Result<u64, StoreError>;

    /// Whether the consume whose allowed entry is `id` waits in `shard`'s totals, moving
    /// or not (it was allowed and applied).
    async fn in_totals(&self, shard: u16, id: &str) -> Result<bool, StoreError>;
}
