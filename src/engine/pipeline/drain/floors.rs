//! The floors of the shards' write generations, as the drain records and reads them.

use super::Drainer;
use crate::engine::store::StoreError;
use crate::keys::ledger_stream;
use crate::logs::Throttle;

impl Drainer {
    /// Raises this instance's floors of the shards' write generations to what every
    /// instance's drain recorded in SQL (at start, then every [`FLOORS_EVERY`]); a failure
    /// is logged, and the floors stay as they are until the next read.
    pub(crate) async fn read_floors(&self) {
        match self.ledger.generations(&self.prefix).await {
            Ok(floors) => self.streams.raise_floors(&floors),
            Err(error) => {
                static SITE: Throttle = Throttle::per_minute();
                if let Some(count) = SITE.event() {
                    tracing::warn!(error = %error, count, "reading the floors of the shards' write generations failed; will try again");
                }
            }
        }
    }

    /// Raises the floors of `shards` to their write generations now, in SQL and here: a
    /// change made there without an entry of their own streams (a refund's share in a
    /// shared budget's slot of a Redis Cluster, given after its entry was appended at
    /// home, perhaps after the drain read it) is then covered too.
    pub(crate) async fn raise_floors_now(&self, shards: &[u16]) -> Result<(), StoreError> {
        let mut floors = Vec::with_capacity(shards.len());
        for &shard in shards {
            let stream = ledger_stream(&self.prefix, shard);
            if let Some(generation) = self.streams.generation(&stream).await? {
                floors.push((shard, generation));
            }
        }
        if floors.is_empty() {
            return Ok(());
        }
        self.ledger
            .record_generations(&self.prefix, &floors)
            .await
            .map_err(|error| {
                StoreError::Unavailable(format!("recording the shards' write generations: {error}"))
            })?;
        self.streams.raise_floors(&floors);
        Ok(())
    }
}
