//! Giving quota back: refunds of consumes, and the settlement, release and expiry of holds.
//! Each is one atomic counter-store call that restores the counters the charge went to
//! (where they still count), checks and updates the bookkeeping, and appends the ledger entry.

use super::consume::HoldKept;
use super::plan::CounterDetail;
use super::store::{GiveBack, GiveBackKind, GivenBack, IdempotencyRecord};
use super::{Decision, Engine, EngineError};
use crate::domain::{Action, Quantity, Subject};
use crate::domain::{EntryKind, LedgerEntry, PolicyAmount};
use crate::keys::{self, SubjectKeys};

/// Refund idempotency records are kept a day.
const REFUND_IDEMPOTENCY_MS: i64 = 24 * 3_600_000;

/// The answer to a refund or a settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The ledger entry written.
    pub entry: LedgerEntry,
    /// Current usage of the action's policies for the subject, after it.
    pub usage: Option<Decision>,
    /// True when this replays an earlier refund with the same idempotency key.
    pub replayed: bool,
}

/// How to settle a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Keep this much (default: all of it); the rest goes back.
    Commit(Option<Quantity>),
    /// Give it all back.
    Release,
}

fn corrupt(what: &str) -> EngineError {
    EngineError::Store(super::store::StoreError::Protocol(format!(
        "{what} is malformed"
    )))
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Per-policy amounts given back: amount policies get `by_amount` (at most what they were
/// charged), count policies their charge when `full`.
fn given(counters: &[CounterDetail], by_amount: u64, full: bool) -> Vec<PolicyAmount> {
    counters
        .iter()
        .map(|c| PolicyAmount {
            policy_id: c.policy_id.clone(),
            amount: match (c.by_amount, full) {
                (true, _) => by_amount.min(c.charged),
                (false, true) => c.charged,
                (false, false) => 0,
            },
        })
        .filter(|p| p.amount > 0)
        .collect()
}

/// The shard a hold id names (`<uuid>.<shard>`).
fn hold_shard(hold_id: &str) -> Option<u16> {
    let (uuid, shard) = hold_id.rsplit_once('.')?;
    uuid::Uuid::parse_str(uuid).ok()?;
    shard.parse().ok().filter(|s| *s < keys::SHARDS)
}

impl Engine {
    /// Gives back `amount` (default: all not yet refunded) of the consume `consumption_id`.
    pub async fn refund(
        &self,
        consumption_id: &str,
        amount: Option<Quantity>,
        idempotency_key: Option<String>,
    ) -> Result<Settled, EngineError> {
        let charge = self.find_charge(consumption_id).await?;
        let counters: Vec<CounterDetail> =
            serde_json::from_str(charge.detail.as_deref().unwrap_or("[]"))
                .map_err(|_| corrupt("a charge's detail"))?;
        let action =
            Action::parse("action", &charge.action).map_err(|_| corrupt("a charge's action"))?;
        let subject = Subject::parse("subject", &charge.subject)
            .map_err(|_| corrupt("a charge's subject"))?;
        let keys = SubjectKeys::new(&self.prefix, &action, &subject);
        let now = self.now();
        let control_key = keys::refunded_total(&self.prefix, keys.shard, consumption_id);
        // The store's running total is current; the ledger may lag it (Redis drains later)
        // but outlives it. The script checks again, atomically, so this only sets defaults.
        let kept = self
            .counters
            .record(&control_key, now.timestamp_millis())
            .await?;
        let refunded = match kept.and_then(|t| t.parse::<u64>().ok()) {
            Some(total) => total,
            None => self.ledger.refunded(consumption_id).await?,
        };
        let total = charge.amount;
        let amount = amount.map_or(total.saturating_sub(refunded), Quantity::get);
        if amount == 0 {
            return Err(EngineError::Conflict(format!(
                "consumption '{consumption_id}' has been refunded in full already"
            )));
        }
        let entry = LedgerEntry {
            id: uuid::Uuid::now_v7().to_string(),
            at: now,
            kind: EntryKind::Refund,
            action: charge.action.clone(),
            subject: charge.subject.clone(),
            amount,
            consumption_id: Some(consumption_id.to_owned()),
            hold_id: None,
            idempotency_key: idempotency_key.clone(),
            policies: given(&counters, amount, refunded + amount == total),
            detail: None,
        };
        let request = GiveBack {
            kind: GiveBackKind::Refund {
                amount,
                total,
                refunded,
            },
            control_key,
            hold_index: None,
            counters: counters.iter().map(CounterDetail::counter_back).collect(),
            ledger: self.counters.streams_ledger().then(|| {
                (
                    keys::ledger_stream(&self.prefix, keys.shard),
                    to_json(&entry),
                )
            }),
            idempotency: idempotency_key.as_ref().map(|key| IdempotencyRecord {
                key: keys.idempotency('r', &format!("{consumption_id}:{key}")),
                ttl_ms: REFUND_IDEMPOTENCY_MS,
                record: to_json(&entry),
            }),
        };
        match self
            .counters
            .give_back(now.timestamp_millis(), &request)
            .await?
        {
            GivenBack::Done { .. } => {
                if !self.counters.streams_ledger() {
                    self.record(vec![entry.clone()]).await?;
                }
                let usage = self.usage(&action, &subject).await.ok();
                Ok(Settled {
                    entry,
                    usage,
                    replayed: false,
                })
            }
            GivenBack::Conflict(before) => Err(EngineError::Conflict(format!(
                "refunding {amount} would exceed the charge of {total}: {before} refunded already"
            ))),
            GivenBack::Replayed(kept) => {
                let record = kept.rsplit_once('\n').map_or(kept.as_str(), |(r, _)| r);
                let earlier: LedgerEntry =
                    serde_json::from_str(record).map_err(|_| corrupt("a refund record"))?;
                if earlier.amount != amount {
                    return Err(EngineError::Conflict(format!(
                        "idempotency key was used for a refund of {}, not {amount}",
                        earlier.amount
                    )));
                }
                let usage = self.usage(&action, &subject).await.ok();
                Ok(Settled {
                    entry: earlier,
                    usage,
                    replayed: true,
                })
            }
            GivenBack::Unknown => Err(EngineError::NotFound(format!(
                "no consumption '{consumption_id}'"
            ))),
        }
    }

    /// The charge entry of a consumption; drains the Redis streams first if it is not in SQL.
    async fn find_charge(&self, consumption_id: &str) -> Result<LedgerEntry, EngineError> {
        if let Some(entry) = self.ledger.charge_of(consumption_id).await? {
            return Ok(entry);
        }
        if let Some(drain) = &self.drain {
            drain.drain_once().await;
            if let Some(entry) = self.ledger.charge_of(consumption_id).await? {
                return Ok(entry);
            }
        }
        Err(EngineError::NotFound(format!(
            "no consumption '{consumption_id}'"
        )))
    }

    /// Commits or releases the hold `hold_id`.
    pub async fn settle(&self, hold_id: &str, how: Settle) -> Result<Settled, EngineError> {
        let not_found = || EngineError::NotFound(format!("no hold '{hold_id}'"));
        let shard = hold_shard(hold_id).ok_or_else(not_found)?;
        let (kept, done) = self.give_hold_back(shard, hold_id, Some(how)).await?;
        match done {
            GivenBack::Done { .. } => {}
            GivenBack::Conflict(state) => {
                return Err(EngineError::Conflict(format!(
                    "hold '{hold_id}' is {state}"
                )))
            }
            _ => return Err(not_found()),
        }
        let (action, subject) = (
            Action::parse("action", &kept.0.action).map_err(|_| corrupt("a hold record"))?,
            Subject::parse("subject", &kept.0.subject).map_err(|_| corrupt("a hold record"))?,
        );
        let usage = self.usage(&action, &subject).await.ok();
        Ok(Settled {
            entry: kept.1,
            usage,
            replayed: false,
        })
    }

    /// Releases every expired hold of every shard; returns how many.
    pub async fn expire_due_holds(&self) -> usize {
        let mut expired = 0;
        for shard in 0..keys::SHARDS {
            let index = keys::holds_index(&self.prefix, shard);
            let now_ms = self.now().timestamp_millis();
            let due = match self.counters.expired_holds(&index, now_ms, 100).await {
                Ok(due) => due,
                Err(error) => {
                    tracing::warn!(error = %error, "listing expired holds failed");
                    return expired;
                }
            };
            for hold_id in due {
                match self.give_hold_back(shard, &hold_id, None).await {
                    Ok((_, GivenBack::Done { .. })) => expired += 1,
                    Ok(_) => {}
                    Err(error) => tracing::warn!(error = %error, hold_id, "expiring a hold failed"),
                }
            }
        }
        expired
    }

    /// Settles (`how`) or expires (`None`) a hold; returns its record, the entry and the result.
    async fn give_hold_back(
        &self,
        shard: u16,
        hold_id: &str,
        how: Option<Settle>,
    ) -> Result<((HoldKept, LedgerEntry), GivenBack), EngineError> {
        let now = self.now();
        let record_key = keys::hold_record(&self.prefix, shard, hold_id);
        let index = keys::holds_index(&self.prefix, shard);
        let text = self
            .counters
            .record(&record_key, now.timestamp_millis())
            .await?;
        let kept: Option<HoldKept> = text
            .as_deref()
            .and_then(|t| t.split_once('\n'))
            .and_then(|(_, json)| serde_json::from_str(json).ok());
        let Some(kept) = kept else {
            // No record: drop the index entry (if any) and report an unknown hold.
            let request = GiveBack {
                kind: GiveBackKind::Expire {
                    total: 0,
                    expires_at_ms: 0,
                },
                control_key: record_key,
                hold_index: Some((index, hold_id.to_owned())),
                counters: Vec::new(),
                ledger: None,
                idempotency: None,
            };
            let done = self
                .counters
                .give_back(now.timestamp_millis(), &request)
                .await?;
            let placeholder = HoldKept {
                action: String::new(),
                subject: String::new(),
                amount: 0,
                expires_at_ms: 0,
                counters: Vec::new(),
            };
            let entry = self.hold_entry(&placeholder, hold_id, EntryKind::Expire, 0, Vec::new());
            return Ok((
                (placeholder, entry),
                if done == GivenBack::Unknown {
                    done
                } else {
                    GivenBack::Unknown
                },
            ));
        };
        let total = kept.amount;
        let expires_at_ms = kept.expires_at_ms;
        let (kind, entry_kind, entry_amount, policies) = match how {
            Some(Settle::Commit(amount)) => {
                let settle = amount.map_or(total, Quantity::get);
                if settle > total {
                    return Err(EngineError::Conflict(format!(
                        "hold '{hold_id}' holds {total}; cannot commit {settle}"
                    )));
                }
                (
                    GiveBackKind::Commit {
                        settle,
                        total,
                        expires_at_ms,
                    },
                    EntryKind::Commit,
                    settle,
                    given(&kept.counters, total - settle, false),
                )
            }
            Some(Settle::Release) => (
                GiveBackKind::Release {
                    total,
                    expires_at_ms,
                },
                EntryKind::Release,
                total,
                given(&kept.counters, total, true),
            ),
            None => (
                GiveBackKind::Expire {
                    total,
                    expires_at_ms,
                },
                EntryKind::Expire,
                total,
                given(&kept.counters, total, true),
            ),
        };
        let entry = self.hold_entry(&kept, hold_id, entry_kind, entry_amount, policies);
        let request = GiveBack {
            kind,
            control_key: record_key,
            hold_index: Some((index, hold_id.to_owned())),
            counters: kept
                .counters
                .iter()
                .map(CounterDetail::counter_back)
                .collect(),
            ledger: self
                .counters
                .streams_ledger()
                .then(|| (keys::ledger_stream(&self.prefix, shard), to_json(&entry))),
            idempotency: None,
        };
        let done = self
            .counters
            .give_back(now.timestamp_millis(), &request)
            .await?;
        if matches!(done, GivenBack::Done { .. }) && !self.counters.streams_ledger() {
            self.record(vec![entry.clone()]).await?;
        }
        Ok(((kept, entry), done))
    }

    fn hold_entry(
        &self,
        kept: &HoldKept,
        hold_id: &str,
        kind: EntryKind,
        amount: u64,
        policies: Vec<PolicyAmount>,
    ) -> LedgerEntry {
        LedgerEntry {
            id: uuid::Uuid::now_v7().to_string(),
            at: self.now(),
            kind,
            action: kept.action.clone(),
            subject: kept.subject.clone(),
            amount,
            consumption_id: None,
            hold_id: Some(hold_id.to_owned()),
            idempotency_key: None,
            policies,
            detail: None,
        }
    }
}
