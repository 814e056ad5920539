//! The counter store's shards as a rebuild and a verify see them (Redis): the port the
//! recovery part uses and the Redis store implements, and what a cut of shards reads.

use super::codec;
use super::state::StateItem;
use super::store::StoreError;
use async_trait::async_trait;
use std::collections::BTreeMap;

/// The counter store's shards, as a rebuild and a verify see them (Redis).
#[async_trait]
pub(crate) trait ShardStates: Send + Sync {
    /// The shards without an epoch.
    async fn closed_shards(&self) -> Result<Vec<u16>, StoreError>;

    /// Takes `shard`'s rebuild lock as `token` for `ttl_ms`; false when another holds it.
    async fn lock_shard(&self, shard: u16, token: &str, ttl_ms: u64) -> Result<bool, StoreError>;

    /// Deletes the epochs of `shards`: their next decisions wait for a rebuild.
    async fn close_shards(&self, shards: &[u16]) -> Result<(), StoreError>;

    /// Deletes `shard`'s index of open holds (it is written anew), if the shard is still
    /// closed and locked by `token`; false otherwise.
    async fn clear_holds_index(
        &self,
        shard: u16,
        token: &str,
        lock_ttl_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Writes `items` (absolute values, as of `now_ms`) into `shard` while it is closed and
    /// locked by `token`, extending the lock; opens the shard after the last if `open`.
    /// False when refused: the lock was lost, or the shard is open already.
    async fn write_shard(
        &self,
        shard: u16,
        token: &str,
        lock_ttl_ms: u64,
        now_ms: i64,
        items: &[StateItem],
        open: bool,
    ) -> Result<bool, StoreError>;

    /// Every counter key the store holds, by shard (what a verify compares).
    async fn counter_keys(&self) -> Result<BTreeMap<u16, Vec<String>>, StoreError>;

    /// Holds deletions from every shard's ledger stream for `ttl_ms`, as `token`: drained
    /// entries are acknowledged but stay in their streams until [`Self::release_deletes`].
    async fn hold_deletes(&self, token: &str, ttl_ms: u64) -> Result<(), StoreError>;

    /// Lets deletions go on (if `token` still holds them) and deletes what was held.
    async fn release_deletes(&self, token: &str) -> Result<(), StoreError>;

    /// At one instant, the entries in `shards`' streams and the states of `counters` (all
    /// in one slot on a cluster); `None` when `token` no longer holds their deletions.
    async fn read_cut(
        &self,
        token: &str,
        shards: &[u16],
        counters: &[String],
        now_ms: i64,
    ) -> Result<Option<Cut>, StoreError>;

    /// Each of `shards`' version of steps across Redis Cluster slots, with its epoch: equal
    /// twice, no such step changed its counters in between (`keys::cross_slot_version`).
    async fn cross_slot_versions(&self, shards: &[u16]) -> Result<Vec<String>, StoreError>;
}

/// Some shards' streams and counters, read at one instant.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    /// The streams' entries (stream id, encoded entries), in stream order.
    pub(crate) entries: Vec<(String, String)>,
    /// The counters' states (absent counters have none).
    pub(crate) items: Vec<StateItem>,
    /// The records of the shards' intents (consumes across Redis Cluster slots).
    pub(crate) intents: Vec<String>,
    /// The shards' consumes recorded in the ledger's totals: per shard, its waiting hash
    /// and its moving one (field, value; `#` names a hash's content), those not empty.
    pub(crate) totals: Vec<Vec<(String, String)>>,
}

impl Cut {
    /// The counters charged by consumes still in flight across slots: an open intent has
    /// charged its home counters, and its entry comes with its finalize.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = String> + '_ {
        self.intents
            .iter()
            .filter_map(|text| codec::decode_intent(text).ok())
            .filter(|(state, _)| state == "open")
            .flat_map(|(_, record)| record.home.into_iter().map(|counter| counter.key))
    }
}
