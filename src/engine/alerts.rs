//! Alert events, read from the book of record: an entry of a charge whose policies alert
//! keeps the answer it was given (each policy's usage after it), and with what it charged
//! that tells which thresholds it reached. One decision moves usage once, so each crossing
//! belongs to exactly one entry, and an event's id is its entry's id with the policy and
//! the threshold: written with its entry (`LedgerStore::append`), an event is never lost
//! nor doubled, whatever retries, replays or instances there are.

use crate::domain::{Budget, Crossing, EntryKind, LedgerEntry, Thresholds};
use crate::engine::codec;
use crate::engine::store::Decided;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// What a give-back's entry keeps to tell its crossings (`decision::giveback`), per counter it gives back to
/// (`None` for one whose policy does not alert): the store appends each counter's usage
/// before and after (`giveback.lua`'s report) to the text.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GiveBackAlerts {
    pub(crate) alerts: Vec<Option<CounterAlert>>,
}

/// A counter's policy that alerts, as it stood when the give-back was made.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CounterAlert {
    pub(crate) policy_id: String,
    /// The budget the counter counts.
    pub(crate) budget: BTreeMap<String, String>,
    /// The budget's effective limit (an override's, if active).
    pub(crate) limit: u64,
    pub(crate) thresholds: Vec<u8>,
    /// When the counter's calendar period ends; `None` for other windows.
    pub(crate) resets_at_ms: Option<i64>,
}

/// What the entry of requests decided together (Envoy's descriptors) keeps when a policy
/// alerts: per charge of the combined decision (a counter several requests share is one
/// charge, their costs summed), its policy's alert, and its cost; the store appends the
/// decision's numbers (as `consume.lua` replies them) after a newline. The crossings of
/// the whole decision are one entry's (the last): each is told once.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TogetherAlerts {
    pub(crate) together: Vec<Option<CounterAlert>>,
    pub(crate) costs: Vec<u64>,
}

/// The alert events `entry` records: none unless it charged policies that alert.
pub fn events_of(entry: &LedgerEntry) -> Vec<AlertEvent> {
    let Some(kept) = &entry.kept_answer else {
        return Vec::new();
    };
    if matches!(
        entry.kind,
        EntryKind::Refund | EntryKind::Commit | EntryKind::Release | EntryKind::Expire
    ) {
        return give_back_events(entry, &kept.text);
    }
    if entry.kind == EntryKind::Charge && kept.text.starts_with("{\"together\"") {
        return together_events(entry, &kept.text);
    }
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
            events.push(event(
                entry,
                Crossed {
                    policy_id: policy.policy_id.as_str(),
                    budget: named(&entry.budget(&policy.scope)),
                    crossing,
                    used: after,
                    limit: policy.limit,
                    resets_at: crate::engine::reset_time(outcome.resets_at_ms),
                },
            ));
        }
    }
    events
}

/// The events of a give-back entry whose kept `text` is `decision::giveback`'s with the
/// store's report appended: usage falling back below a threshold resolves it; an
/// over-capture's excess may reach one.
fn give_back_events(entry: &LedgerEntry, text: &str) -> Vec<AlertEvent> {
    let Some((alerts, report)) = text.split_once('\n') else {
        return Vec::new();
    };
    let Ok(GiveBackAlerts { alerts }) = serde_json::from_str(alerts) else {
        return Vec::new();
    };
    let mut events = Vec::new();
    for (alert, usage) in alerts.iter().zip(report.split(';')) {
        let Some(alert) = alert else {
            continue;
        };
        let Some((before, after)) = usage
            .split_once(',')
            .and_then(|(b, a)| Some((b.parse::<u64>().ok()?, a.parse::<u64>().ok()?)))
        else {
            continue;
        };
        let resets_at = alert.resets_at_ms.map(crate::engine::from_millis);
        push_crossings(&mut events, entry, alert, (before, after), resets_at);
    }
    events
}

/// Pushes to `events` those of `alert`'s thresholds that usage going `(before, after)`
/// crosses, told by `entry`.
fn push_crossings(
    events: &mut Vec<AlertEvent>,
    entry: &LedgerEntry,
    alert: &CounterAlert,
    (before, after): (u64, u64),
    resets_at: Option<DateTime<Utc>>,
) {
    let percents: Vec<i64> = alert.thresholds.iter().map(|&p| i64::from(p)).collect();
    let Ok(thresholds) = Thresholds::parse("alert_thresholds", &percents) else {
        return;
    };
    for crossing in thresholds.crossed(alert.limit, before, after) {
        events.push(event(
            entry,
            Crossed {
                policy_id: &alert.policy_id,
                budget: alert.budget.clone(),
                crossing,
                used: after,
                limit: alert.limit,
                resets_at,
            },
        ));
    }
}

/// The events of the entry that keeps [`TogetherAlerts`], its `text` followed by the
/// decision's numbers, as an idempotency record ends (`codec::decode_replay`).
fn together_events(entry: &LedgerEntry, text: &str) -> Vec<AlertEvent> {
    let Ok(Decided::Replayed { record, evaluation }) = codec::decode_replay(text) else {
        return Vec::new();
    };
    let Ok(TogetherAlerts { together, costs }) = serde_json::from_str(&record) else {
        return Vec::new();
    };
    let mut events = Vec::new();
    for ((alert, cost), outcome) in together.iter().zip(&costs).zip(&evaluation.outcomes) {
        if let Some(alert) = alert {
            let usage = (outcome.used.saturating_sub(*cost), outcome.used);
            let resets_at = crate::engine::reset_time(outcome.resets_at_ms);
            push_crossings(&mut events, entry, alert, usage, resets_at);
        }
    }
    events
}

/// A budget's keys and values, as an event names them.
pub(crate) fn named(budget: &Budget) -> BTreeMap<String, String> {
    budget
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// One crossing of one budget, for its event.
struct Crossed<'a> {
    policy_id: &'a str,
    budget: BTreeMap<String, String>,
    crossing: Crossing,
    used: u64,
    limit: u64,
    resets_at: Option<DateTime<Utc>>,
}

/// The event of `crossed`, made by `entry`.
fn event(entry: &LedgerEntry, crossed: Crossed<'_>) -> AlertEvent {
    let (event_type, threshold) = match crossed.crossing {
        Crossing::Reached(t) => (REACHED, t),
        Crossing::Resolved(t) => (RESOLVED, t),
    };
    let id = format!("{}.{}.{threshold}", entry.id, crossed.policy_id);
    let payload = serde_json::json!({
        "type": event_type,
        "id": id,
        "at": entry.at,
        "action": entry.action.as_str(),
        "policy_id": crossed.policy_id,
        "budget": crossed.budget,
        "threshold": threshold,
        "used": crossed.used,
        "limit": crossed.limit,
        "resets_at": crossed.resets_at,
    });
    AlertEvent {
        id,
        event_type,
        at: entry.at,
        payload,
    }
}
