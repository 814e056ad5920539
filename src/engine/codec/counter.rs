//! One counter of a charge as the JSON records (a hold's, an intent's) keep it.

use super::{field, scope_from_wire, scope_wire, CodecError};
use crate::domain::{CounterCharge, PolicyId, Restore};
use serde::{Deserialize, Serialize};

/// One counter of a charge, flat, as every version has written it (`kind` 1 calendar,
/// 2 rolling, 3 token bucket, 4 zoned calendar, 5 lifetime; `span_ms` the bucket length or the refill
/// period; a zoned calendar's `bucket` is when it was charged).
#[derive(Serialize, Deserialize)]
pub(super) struct CounterWire {
    policy_id: String,
    key: String,
    kind: u8,
    #[serde(default)]
    bucket: i64,
    #[serde(default)]
    span_ms: i64,
    #[serde(default)]
    buckets: i64,
    #[serde(default)]
    limit: u64,
    /// Calendar: when the period ends, Unix ms (absent before it was recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    end_ms: i64,
    by_amount: bool,
    charged: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl From<&CounterCharge> for CounterWire {
    fn from(c: &CounterCharge) -> Self {
        let (kind, bucket, span_ms, buckets, limit, end_ms) = match c.restore {
            Restore::Calendar { period_end_ms } => (1, 0, 0, 0, 0, period_end_ms),
            Restore::Rolling {
                bucket,
                bucket_ms,
                buckets,
            } => (2, bucket, bucket_ms, buckets, 0, 0),
            Restore::TokenBucket { period_ms, limit } => (3, 0, period_ms, 0, limit, 0),
            Restore::Lifetime => (5, 0, 0, 0, 0, 0),
            Restore::ZonedCalendar {
                period_end_ms,
                charged_at_ms,
            } => (4, charged_at_ms, 0, 0, 0, period_end_ms),
        };
        Self {
            policy_id: c.policy_id.to_string(),
            key: c.key.clone(),
            kind,
            bucket,
            span_ms,
            buckets,
            limit,
            end_ms,
            by_amount: c.by_amount,
            charged: c.charged,
            scope: scope_wire(&c.scope),
        }
    }
}

pub(super) fn decode_counter_wires(
    wires: Vec<CounterWire>,
) -> Result<Vec<CounterCharge>, CodecError> {
    const WHAT: &str = "counter of a charge";
    wires
        .into_iter()
        .map(|w| {
            let restore = match w.kind {
                1 => Restore::Calendar {
                    period_end_ms: w.end_ms,
                },
                2 if w.span_ms > 0 && w.buckets > 0 => Restore::Rolling {
                    bucket: w.bucket,
                    bucket_ms: w.span_ms,
                    buckets: w.buckets,
                },
                3 if w.span_ms > 0 => Restore::TokenBucket {
                    period_ms: w.span_ms,
                    limit: w.limit,
                },
                5 => Restore::Lifetime,
                4 => Restore::ZonedCalendar {
                    period_end_ms: w.end_ms,
                    charged_at_ms: w.bucket,
                },
                kind => {
                    return Err(CodecError::new(
                        WHAT,
                        format!(
                            "kind {kind} with span {} ms and {} buckets",
                            w.span_ms, w.buckets
                        ),
                    ))
                }
            };
            Ok(CounterCharge {
                policy_id: field(WHAT, PolicyId::parse("policy_id", &w.policy_id))?,
                key: w.key,
                restore,
                by_amount: w.by_amount,
                charged: w.charged,
                scope: scope_from_wire(WHAT, w.scope.as_deref())?,
            })
        })
        .collect()
}
