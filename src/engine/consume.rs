//! Consumes and holds: the charge, its idempotency record, its ledger entry and (for a
//! hold) its record, all in one atomic counter-store call.

use super::plan::{replayed_decision, CounterDetail, KeptPolicy, Plan};
use super::store::{Decided, Effects, HoldOpen, IdempotencyRecord, LedgerAppend};
use super::{from_millis, ConsumeRequest, Decision, Engine, EngineError};
use crate::domain::{EntryKind, LedgerEntry};
use crate::keys;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Idempotency records live at least a day, and at least as long as the longest window.
const MIN_IDEMPOTENCY_MS: i64 = 24 * 3_600_000;

/// Hold records outlive their hold by a week, so late settlement attempts get a clear 409.
const HOLD_RECORD_EXTRA_MS: i64 = 7 * 24 * 3_600_000;

/// A hold's id and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldTicket {
    /// `<uuid>.<shard>`: names the hold and where its record lives.
    pub hold_id: String,
    /// When it is released unless settled.
    pub expires_at: DateTime<Utc>,
}

/// The answer to a consume or hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    /// The decision.
    pub decision: Decision,
    /// The consume's id (consumes only).
    pub consumption_id: Option<String>,
    /// The hold (holds only, when allowed).
    pub hold: Option<HoldTicket>,
    /// True when this replays an earlier answer for the same idempotency key.
    pub replayed: bool,
}

/// What an idempotency record keeps to rebuild the original answer.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    consumption_id: Option<String>,
    hold_id: Option<String>,
    hold_expires_at_ms: Option<i64>,
    amount: u64,
    at_ms: i64,
    policies: Vec<KeptPolicy>,
}

/// A hold's record in the counter store: everything needed to settle or expire it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct HoldKept {
    pub action: String,
    pub subject: String,
    pub amount: u64,
    pub expires_at_ms: i64,
    pub counters: Vec<CounterDetail>,
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing plain structs of strings and numbers cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

impl Engine {
    /// Charges `request` to every enabled policy of its action, atomically.
    pub async fn consume(&self, request: &ConsumeRequest) -> Result<Consumed, EngineError> {
        self.charge(request, None).await
    }

    /// Reserves `request` like a consume, until settled or `ttl_seconds` pass.
    pub async fn hold(
        &self,
        request: &ConsumeRequest,
        ttl_seconds: u64,
    ) -> Result<Consumed, EngineError> {
        self.charge(request, Some(ttl_seconds)).await
    }

    async fn charge(
        &self,
        request: &ConsumeRequest,
        hold_ttl: Option<u64>,
    ) -> Result<Consumed, EngineError> {
        let plan = self.plan(&request.action, &request.subject, request.amount)?;
        let now_ms = plan.now_ms();
        let uuid = uuid::Uuid::now_v7();
        let shard = plan.keys.shard;
        let (consumption_id, hold) = match hold_ttl {
            None => (Some(uuid.to_string()), None),
            Some(ttl) => {
                let ttl_ms = i64::try_from(ttl).unwrap_or(i64::MAX / 2_000) * 1_000;
                let ticket = HoldTicket {
                    hold_id: format!("{uuid}.{shard}"),
                    expires_at: from_millis(now_ms + ttl_ms),
                };
                (None, Some((ticket, ttl_ms)))
            }
        };
        let entry = |kind: EntryKind, denial: bool| LedgerEntry {
            id: uuid::Uuid::now_v7().to_string(),
            at: plan.now,
            kind,
            action: request.action.to_string(),
            subject: request.subject.to_string(),
            amount: request.amount.get(),
            consumption_id: consumption_id.clone(),
            hold_id: hold.as_ref().map(|(t, _)| t.hold_id.clone()),
            idempotency_key: request.idempotency_key.clone(),
            policies: plan.policy_amounts(denial),
            detail: (!denial).then(|| to_json(&plan.details())),
        };
        let allowed_entry = entry(
            if hold.is_some() {
                EntryKind::Hold
            } else {
                EntryKind::Charge
            },
            false,
        );
        let denied_entry = plan.records_denials().then(|| entry(EntryKind::Deny, true));

        if plan.charges.is_empty() {
            self.record(vec![allowed_entry.clone()]).await?;
            return Ok(Consumed {
                decision: plan.empty_decision(),
                consumption_id,
                hold: hold.map(|(t, _)| t),
                replayed: false,
            });
        }

        let effects = self.effects(
            &plan,
            request,
            &consumption_id,
            &hold,
            &allowed_entry,
            &denied_entry,
        );
        let decided = match self
            .counters
            .decide(now_ms, &plan.charges, true, &effects)
            .await
        {
            Ok(decided) => decided,
            Err(error) => {
                let decision = self.on_store_failure(&plan, error)?;
                // Failing open: the consume is accepted uncounted; the ledger still records it.
                if let Err(error) = self.record(vec![allowed_entry.clone()]).await {
                    tracing::error!(error = %error, "recording a degraded consume failed");
                }
                return Ok(Consumed {
                    decision,
                    consumption_id,
                    hold: hold.map(|(t, _)| t),
                    replayed: false,
                });
            }
        };
        match decided {
            Decided::Fresh(evaluation) => {
                let decision = plan.decision(&evaluation);
                if !self.counters.streams_ledger() {
                    let written = match (decision.allowed, denied_entry) {
                        (true, _) => Some(allowed_entry),
                        (false, denied) => denied,
                    };
                    if let Some(written) = written {
                        self.record(vec![written]).await?;
                    }
                }
                let allowed = decision.allowed;
                Ok(Consumed {
                    decision,
                    consumption_id,
                    hold: hold.filter(|_| allowed).map(|(t, _)| t),
                    replayed: false,
                })
            }
            Decided::Replayed { record, evaluation } => {
                let kept: Kept = serde_json::from_str(&record).map_err(|e| {
                    EngineError::Store(super::store::StoreError::Protocol(format!(
                        "idempotency record: {e}"
                    )))
                })?;
                if kept.amount != request.amount.get() {
                    return Err(EngineError::Conflict(format!(
                        "idempotency key '{}' was used with amount {}, not {}",
                        request.idempotency_key.as_deref().unwrap_or(""),
                        kept.amount,
                        request.amount
                    )));
                }
                let decision =
                    replayed_decision(&kept.policies, &evaluation, from_millis(kept.at_ms));
                let hold = match (kept.hold_id, kept.hold_expires_at_ms) {
                    (Some(hold_id), Some(at)) => Some(HoldTicket {
                        hold_id,
                        expires_at: from_millis(at),
                    }),
                    _ => None,
                };
                Ok(Consumed {
                    decision,
                    consumption_id: kept.consumption_id,
                    hold,
                    replayed: true,
                })
            }
        }
    }

    /// The effects of a consume: its idempotency record, ledger entries and hold record.
    fn effects(
        &self,
        plan: &Plan,
        request: &ConsumeRequest,
        consumption_id: &Option<String>,
        hold: &Option<(HoldTicket, i64)>,
        allowed_entry: &LedgerEntry,
        denied_entry: &Option<LedgerEntry>,
    ) -> Effects {
        let now_ms = plan.now_ms();
        let idempotency = request.idempotency_key.as_ref().map(|key| {
            let kept = Kept {
                consumption_id: consumption_id.clone(),
                hold_id: hold.as_ref().map(|(t, _)| t.hold_id.clone()),
                hold_expires_at_ms: hold.as_ref().map(|(t, _)| t.expires_at.timestamp_millis()),
                amount: request.amount.get(),
                at_ms: now_ms,
                policies: plan.kept_policies(),
            };
            let scope = if hold.is_some() { 'h' } else { 'c' };
            IdempotencyRecord {
                key: plan.keys.idempotency(scope, key),
                ttl_ms: MIN_IDEMPOTENCY_MS.max(plan.longest_window_ms() + 3_600_000),
                record: to_json(&kept),
            }
        });
        let ledger = self.counters.streams_ledger().then(|| LedgerAppend {
            stream: keys::ledger_stream(&self.prefix, plan.keys.shard),
            allowed: to_json(allowed_entry),
            denied: denied_entry.as_ref().map(to_json),
        });
        let hold = hold.as_ref().map(|(ticket, ttl_ms)| {
            let expires_at_ms = ticket.expires_at.timestamp_millis();
            let kept = HoldKept {
                action: request.action.to_string(),
                subject: request.subject.to_string(),
                amount: request.amount.get(),
                expires_at_ms,
                counters: plan.details(),
            };
            HoldOpen {
                record_key: keys::hold_record(&self.prefix, plan.keys.shard, &ticket.hold_id),
                index_key: keys::holds_index(&self.prefix, plan.keys.shard),
                hold_id: ticket.hold_id.clone(),
                expires_at_ms,
                record: to_json(&kept),
                ttl_ms: ttl_ms + HOLD_RECORD_EXTRA_MS,
            }
        });
        Effects {
            idempotency,
            ledger,
            hold,
        }
    }
}
