//! Alert events, read from the book of record: an entry of a charge whose policies alert
//! keeps the answer it was given (each policy's usage after it), and with what it charged
//! that tells which thresholds it reached. One decision moves usage once, so each crossing
//! belongs to exactly one entry, and an event's id is its entry's id with the policy and
//! the threshold: written with its entry (`LedgerStore::append`), an event is never lost
//! nor doubled, whatever retries, replays or instances there are.

use crate::domain::{Crossing, EntryKind, LedgerEntry};
use crate::engine::codec;
use crate::engine::store::Decided;
use chrono::{DateTime, Utc};

/// One threshold crossed by one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertEvent {
    /// Unique per crossing: `<entry id>.<policy id>.<threshold>`.
    pub id: String,
    /// `budget.threshold` or `budget.threshold.resolved`.
    pub event_type: &'static str,
    /// When the crossing decision was made.
    pub at: DateTime<Utc>,
    /// The event as webhooks receive it.
    pub payload: serde_json::Value,
}

/// The event type of a threshold reached.
pub const REACHED: &str = "budget.threshold";
/// The event type of usage fallen back below a threshold.
pub const RESOLVED: &str = "budget.threshold.resolved";

/// The alert events `entry` records: none unless it charged policies that alert.
pub fn events_of(entry: &LedgerEntry) -> Vec<AlertEvent> {
    let Some(kept) = &entry.kept_answer else {
        return Vec::new();
    };
    // Cheap first: most kept answers (idempotent retries) alert on nothing.
    if !matches!(entry.kind, EntryKind::Charge | EntryKind::Hold)
        || !kept.text.contains("\"alerts\"")
    {
        return Vec::new();
    }
    let Ok(Decided::Replayed { record, evaluation }) = codec::decode_replay(&kept.text) else {
        return Vec::new();
    };
    let Ok(record) = codec::decode_consume_record(&record) else {
        return Vec::new();
    };
    let mut events = Vec::new();
    for ((policy, outcome), charged) in record
        .policies
        .iter()
        .zip(&evaluation.outcomes)
        .zip(&entry.policies)
    {
        let after = outcome.used;
        let before = after.saturating_sub(charged.amount);
        for crossing in policy.alert_thresholds.crossed(policy.limit, before, after) {
            let (event_type, threshold) = match crossing {
                Crossing::Reached(t) => (REACHED, t),
                Crossing::Resolved(t) => (RESOLVED, t),
            };
            let id = format!("{}.{}.{threshold}", entry.id, policy.policy_id);
            let budget = entry.budget(&policy.scope);
            let payload = serde_json::json!({
                "type": event_type,
                "id": id,
                "at": entry.at,
                "action": entry.action.as_str(),
                "policy_id": policy.policy_id.as_str(),
                "budget": budget.iter().collect::<std::collections::BTreeMap<_, _>>(),
                "threshold": threshold,
                "used": after,
                "limit": policy.limit,
                "resets_at": crate::engine::reset_time(outcome.resets_at_ms),
            });
            events.push(AlertEvent {
                id,
                event_type,
                at: entry.at,
                payload,
            });
        }
    }
    events
}
