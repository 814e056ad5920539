//! Record levels (`record` on a policy): which consumes are recorded in the ledger's totals
//! rather than as entries, and what they add to them.
//!
//! A consume is recorded in totals when every policy it charges records `totals`, it
//! carries no idempotency key and it is not a hold. Its entry then still carries
//! everything the engine needs (its counters, to rebuild, verify and void it), but it adds
//! its [`TotalLine`]s to `ledger_totals`, is not listed by `GET /quota/ledger` and its
//! answer names no `consumption_id`. Any other consume writes an entry as before, with
//! every policy's share in it, and adds nothing to the totals.

use crate::domain::{Record, TotalLine};
use crate::engine::decision::plan::Plan;
use crate::engine::from_millis;
use crate::engine::store::{Algorithm, TotalsAppend};
use crate::engine::ConsumeRequest;

impl super::consume::Attempt {
    /// Where the store keeps this attempt's entry instead of the stream (Redis), when the
    /// consume is recorded in the totals: its shard's hash of waiting consumes.
    pub(in crate::engine) fn totals_append(
        &self,
        prefix: &str,
        shard: u16,
    ) -> Option<TotalsAppend> {
        self.in_totals.then(|| TotalsAppend {
            key: crate::keys::totals_waiting(prefix, shard),
            id: self.allowed_entry.id.to_string(),
        })
    }
}

/// An hour, ms: the period of a lifetime or per-request window's totals.
const HOUR_MS: i64 = 3_600_000;

impl Plan {
    /// Whether `request`, decided by this plan (a hold when `hold`), is recorded in the
    /// ledger's totals rather than as an entry.
    pub(in crate::engine) fn records_totals(&self, request: &ConsumeRequest, hold: bool) -> bool {
        !hold
            && request.idempotency_key.is_none()
            && !self.charges.is_empty()
            && self
                .applied_policies()
                .all(|p| p.spec.record == Record::Totals)
    }

    /// What a consume of this plan adds to the ledger's totals: per policy it charges, its
    /// budget in the counter period of the plan's instant, with the units and a request
    /// allowed, or a request denied.
    pub(in crate::engine) fn total_lines(&self, allowed: bool) -> Vec<TotalLine> {
        let now_ms = self.now_ms();
        self.applied_policies()
            .zip(&self.charges)
            .map(|(policy, planned)| {
                let charge = &planned.charge;
                let end_ms = match charge.algorithm {
                    Algorithm::Calendar { period_end_ms }
                    | Algorithm::ZonedCalendar { period_end_ms } => period_end_ms,
                    Algorithm::Rolling { bucket_ms, .. } => next_multiple(now_ms, bucket_ms),
                    Algorithm::TokenBucket { .. } | Algorithm::Request | Algorithm::Lifetime => {
                        next_multiple(now_ms, HOUR_MS)
                    }
                };
                TotalLine {
                    policy_id: policy.id.clone(),
                    budget: planned.budget.text(),
                    period_end: from_millis(end_ms),
                    amount: match allowed {
                        true => i64::try_from(charge.cost).unwrap_or(i64::MAX),
                        false => 0,
                    },
                    allowed: i64::from(allowed),
                    denied: i64::from(!allowed),
                }
            })
            .collect()
    }
}

/// The first multiple of `step` after `ms` (`step` > 0): the end of the bucket `ms` is in.
fn next_multiple(ms: i64, step: i64) -> i64 {
    let step = step.max(1);
    (ms.div_euclid(step) + 1).saturating_mul(step)
}

#[cfg(test)]
mod tests {
    use super::next_multiple;

    #[test]
    fn a_bucket_ends_at_the_next_multiple_of_its_length() {
        assert_eq!(next_multiple(0, 1_000), 1_000);
        assert_eq!(next_multiple(999, 1_000), 1_000);
        assert_eq!(next_multiple(1_000, 1_000), 2_000);
        assert_eq!(next_multiple(-1, 1_000), 0);
    }
}
