//! One clock for every instance: the offset of Redis's clock (`TIME`) from this machine's,
//! measured every second, so that the engine's clock ([`OffsetClock`]) and the deadlines
//! the scripts check are Redis's time whatever this machine's clock says.
//!
//! On a Redis Cluster each primary has a clock of its own. The engine's clock follows the
//! primary of shard 0, the same node for every instance, so that instances decide alike;
//! the call deadline a script checks against its own node's `TIME` is computed from the
//! offset of that node, measured for each shard's primary ([`NodeOffsets`]), so that a
//! node whose clock is off decides on time all the same.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};

use super::call::{bounded, wall_clock_ms};
use super::connection::Connection;
use super::RedisCounterStore;
use crate::clock::OffsetClock;
use crate::engine::store::StoreError;
use crate::keys::SHARDS;
use crate::logs::Throttle;

/// How often the offset is measured.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// How many recent samples the offset is chosen from: the one with the shortest round trip
/// (the tightest bound) wins, so that one slow reply does not move the clock.
const SAMPLES: usize = 5;

/// One measurement: the offset, and half the round trip (its error bound), milliseconds.
#[derive(Debug, Clone, Copy)]
struct Sample {
    offset_ms: i64,
    bound_ms: i64,
}

/// The offset of each shard's primary on a Redis Cluster, ms ([`UNKNOWN`] until measured).
#[derive(Debug)]
pub(super) struct NodeOffsets(Vec<AtomicI64>);

/// An offset not measured yet.
const UNKNOWN: i64 = i64::MIN;

impl Default for NodeOffsets {
    fn default() -> Self {
        Self((0..SHARDS).map(|_| AtomicI64::new(UNKNOWN)).collect())
    }
}

/// The most recent [`SAMPLES`] of one clock, and the best of them.
#[derive(Default)]
struct Recent(Vec<Sample>);

impl Recent {
    /// Keeps `sample`; the one with the tightest bound of those kept.
    fn best_with(&mut self, sample: Sample) -> Sample {
        if self.0.len() == SAMPLES {
            self.0.remove(0);
        }
        self.0.push(sample);
        self.0
            .iter()
            .min_by_key(|s| s.bound_ms)
            .map_or(sample, |s| *s)
    }
}

impl RedisCounterStore {
    /// The store, keeping `clock` at Redis's time (measured now, then every second in the
    /// background while the store lives) and warning, once a minute, while the offset
    /// exceeds `max_offset`.
    pub(crate) async fn keeping_time(
        mut self,
        clock: Arc<OffsetClock>,
        max_offset: Duration,
    ) -> Self {
        self.time = Some(clock.clone());
        if self.cluster {
            self.node_offsets = Some(Arc::default());
        }
        let reference = self.cluster.then_some(0);
        if let Ok(sample) = self.sample(reference).await {
            clock.set_offset_ms(sample.offset_ms);
        }
        let store = self.clone();
        let max_ms = i64::try_from(max_offset.as_millis()).unwrap_or(i64::MAX);
        tokio::spawn(async move {
            let mut recent = Recent::default();
            let mut nodes: Vec<Recent> = (0..SHARDS).map(|_| Recent::default()).collect();
            loop {
                tokio::time::sleep(MEASURE_EVERY).await;
                // The store's other clones are gone: the service stopped.
                if Arc::strong_count(&store.id) == 1 {
                    return;
                }
                if let Some(offsets) = &store.node_offsets {
                    store.measure_nodes(offsets, &mut nodes, max_ms).await;
                }
                let Ok(sample) = store.sample(reference).await else {
                    continue;
                };
                let best = recent.best_with(sample);
                clock.set_offset_ms(best.offset_ms);
                if best.offset_ms.abs() > max_ms {
                    static SITE: Throttle = Throttle::per_minute();
                    if let Some(count) = SITE.event() {
                        tracing::warn!(
                            count,
                            offset_ms = best.offset_ms,
                            bound_ms = best.bound_ms,
                            max_ms,
                            "this machine's clock differs from Redis's by more than QUOTA_MAX_CLOCK_OFFSET_MS; decisions follow Redis's clock, but fix the machine's time (NTP)"
                        );
                    }
                }
            }
        });
        self
    }

    /// Measures the offset of every shard's primary (a cluster), all at once; warns, once a
    /// minute, while one differs from shard 0's (the engine's clock) by more than `max_ms`.
    async fn measure_nodes(&self, offsets: &NodeOffsets, nodes: &mut [Recent], max_ms: i64) {
        let mut samples = tokio::task::JoinSet::new();
        for shard in 0..SHARDS {
            let store = self.clone();
            samples.spawn(async move { (shard, store.sample(Some(shard)).await) });
        }
        while let Some(done) = samples.join_next().await {
            if let Ok((shard, Ok(sample))) = done {
                let best = nodes[usize::from(shard)].best_with(sample);
                offsets.0[usize::from(shard)].store(best.offset_ms, Ordering::Relaxed);
            }
        }
        let known: Vec<i64> = offsets
            .0
            .iter()
            .map(|offset| offset.load(Ordering::Relaxed))
            .collect();
        let Some(&reference) = known.first().filter(|o| **o != UNKNOWN) else {
            return;
        };
        let apart = known
            .iter()
            .filter(|o| **o != UNKNOWN)
            .map(|o| (o - reference).abs())
            .max()
            .unwrap_or(0);
        if apart > max_ms {
            static SITE: Throttle = Throttle::per_minute();
            if let Some(count) = SITE.event() {
                tracing::warn!(
                    count,
                    apart_ms = apart,
                    max_ms,
                    "the clocks of the Redis Cluster's primaries differ by more than QUOTA_MAX_CLOCK_OFFSET_MS; each call is timed by its own node's clock and decisions follow shard 0's, but fix the nodes' time (NTP)"
                );
            }
        }
    }

    /// Redis's time minus this machine's, from one `TIME`: on `shard`'s primary, or any
    /// node.
    async fn sample(&self, shard: Option<u16>) -> Result<Sample, StoreError> {
        let sent_ms = wall_clock_ms();
        let started = Instant::now();
        let (seconds, micros): (i64, i64) = match shard {
            Some(shard) => self.time_of(shard).await?,
            None => self.plain(&redis::cmd("TIME")).await?,
        };
        let round_trip = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let redis_ms = seconds * 1_000 + micros / 1_000;
        Ok(Sample {
            offset_ms: redis_ms - (sent_ms + round_trip / 2),
            bound_ms: round_trip / 2 + 1,
        })
    }

    /// `TIME` on the primary of `shard`'s slot (any node outside a cluster).
    async fn time_of(&self, shard: u16) -> Result<(i64, i64), StoreError> {
        let Connection::Cluster(mut cluster, _) = self.connection().await? else {
            return self.plain(&redis::cmd("TIME")).await;
        };
        let key = crate::keys::ledger_stream(&self.prefix, shard);
        let route = Route::with_slot(Slot::for_key(key.as_bytes()), SlotAddr::Master);
        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
        let reply = bounded(
            self.timeout,
            cluster.route_command(redis::cmd("TIME"), node),
        )
        .await?;
        redis::from_redis_value(reply).map_err(|error| StoreError::Protocol(error.to_string()))
    }

    /// Now on Redis's clock as this instance knows it (this machine's clock without one).
    pub(super) fn redis_now_ms(&self) -> i64 {
        self.time
            .as_ref()
            .map_or_else(wall_clock_ms, |clock| clock.now_ms())
    }

    /// Now on the clock of the node that holds `key` (a cluster's primary of its slot, once
    /// measured), else [`Self::redis_now_ms`].
    pub(super) fn node_now_ms(&self, key: &str) -> i64 {
        let offset = self.node_offsets.as_ref().and_then(|offsets| {
            let shard = crate::keys::shard_of(key)?;
            let offset = offsets.0.get(usize::from(shard))?.load(Ordering::Relaxed);
            (offset != UNKNOWN).then_some(offset)
        });
        match offset {
            Some(offset) => wall_clock_ms() + offset,
            None => self.redis_now_ms(),
        }
    }
}
