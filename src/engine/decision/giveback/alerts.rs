//! What a give-back keeps for alerts: the alerting counters' policies, to which the
//! counter store appends each counter's usage before and after (`engine::alerts` reads
//! the crossings from it).

use crate::domain::{CounterCharge, KeptAnswer, LedgerEntry, Restore};
use crate::engine::alerts::{named, CounterAlert, GiveBackAlerts};
use crate::engine::decision::policies::ActionPolicies;

/// The start of the answer a give-back `entry` (a refund, settlement or expiry of a charge
/// to `counters`) keeps when a policy of `policies` alerts: each alerting counter's policy,
/// limit and thresholds, then a newline, after which the store appends the usage report.
/// Kept already expired: nothing replays it; it only tells the thresholds crossed.
pub(super) fn give_back_kept(
    policies: &ActionPolicies,
    entry: &LedgerEntry,
    counters: &[CounterCharge],
) -> Option<KeptAnswer> {
    let alerting = |c: &CounterCharge| {
        policies
            .enabled
            .iter()
            .find(|p| p.id == c.policy_id && !p.spec.alert_thresholds.is_empty())
    };
    if !counters.iter().any(|c| alerting(c).is_some()) {
        return None;
    }
    let alerts = counters
        .iter()
        .map(|c| {
            let policy = alerting(c)?;
            let budget = entry.budget(&c.scope);
            Some(CounterAlert {
                policy_id: policy.id.as_str().to_owned(),
                budget: named(&budget),
                limit: policies.limit_for(policy, &budget, entry.at),
                thresholds: policy.spec.alert_thresholds.percents().to_vec(),
                resets_at_ms: match c.restore {
                    Restore::Calendar { period_end_ms }
                    | Restore::ZonedCalendar { period_end_ms, .. } => Some(period_end_ms),
                    _ => None,
                },
            })
        })
        .collect();
    let text = serde_json::to_string(&GiveBackAlerts { alerts }).ok()?;
    Some(KeptAnswer {
        text: format!("{text}\n"),
        expires_at_ms: entry.at.timestamp_millis(),
    })
}

/// `entry` with the store's usage report appended to what it keeps for alerts (the
/// stream's copy got it from the store already).
pub(in crate::engine::decision) fn with_usage(mut entry: LedgerEntry, usage: &str) -> LedgerEntry {
    if let Some(kept) = entry.kept_answer.as_mut().filter(|_| !usage.is_empty()) {
        kept.text.push_str(usage);
    }
    entry
}
