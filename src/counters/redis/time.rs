//! One clock for every instance: the offset of Redis's clock (`TIME`) from this machine's,
//! measured every second, so that the engine's clock ([`OffsetClock`]) and the deadlines
//! the scripts check are Redis's time whatever this machine's clock says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::call::wall_clock_ms;
use super::RedisCounterStore;
use crate::clock::OffsetClock;
use crate::engine::store::StoreError;
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
        if let Ok(sample) = self.sample().await {
            clock.set_offset_ms(sample.offset_ms);
        }
        let store = self.clone();
        let max_ms = i64::try_from(max_offset.as_millis()).unwrap_or(i64::MAX);
        tokio::spawn(async move {
            let mut recent: Vec<Sample> = Vec::with_capacity(SAMPLES);
            loop {
                tokio::time::sleep(MEASURE_EVERY).await;
                // The store's other clones are gone: the service stopped.
                if Arc::strong_count(&store.id) == 1 {
                    return;
                }
                let Ok(sample) = store.sample().await else {
                    continue;
                };
                if recent.len() == SAMPLES {
                    recent.remove(0);
                }
                recent.push(sample);
                let best = recent
                    .iter()
                    .min_by_key(|s| s.bound_ms)
                    .map_or(sample, |s| *s);
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

    /// Redis's time minus this machine's, from one `TIME`.
    async fn sample(&self) -> Result<Sample, StoreError> {
        let sent_ms = wall_clock_ms();
        let started = Instant::now();
        let (seconds, micros): (i64, i64) = self.plain(&redis::cmd("TIME")).await?;
        let round_trip = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let redis_ms = seconds * 1_000 + micros / 1_000;
        Ok(Sample {
            offset_ms: redis_ms - (sent_ms + round_trip / 2),
            bound_ms: round_trip / 2 + 1,
        })
    }

    /// Now on Redis's clock as this instance knows it (this machine's clock without one).
    pub(super) fn redis_now_ms(&self) -> i64 {
        self.time
            .as_ref()
            .map_or_else(wall_clock_ms, |clock| clock.now_ms())
    }
}
