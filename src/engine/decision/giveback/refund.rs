//! Refunds of consumes: all or part of a charge given back to exactly the counters it
//! went to, at most once per idempotency key, never more than was charged.

use super::{given, Settled};
use crate::domain::{
    ActionSet, ConsumptionId, EntryId, EntryKind, IdempotencyKey, LedgerEntry, Quantity,
};
use crate::engine::codec;
use crate::engine::decision::Decider;
use crate::engine::store::{GiveBack, GiveBackKind, GivenBack, IdempotencyRecord, StoreError};
use crate::engine::EngineError;
use crate::keys::{self, SubjectKeys};
use chrono::{DateTime, Utc};

/// Refund idempotency records are kept a day.
const REFUND_IDEMPOTENCY_MS: i64 = 24 * 3_600_000;

impl Decider {
    /// Gives back `amount` (default: all not yet refunded) of the consume `consumption_id`.
    /// A consumption of an action outside `visible` is unknown to the caller: not found,
    /// and nothing changes.
    pub(crate) async fn refund(
        &self,
        consumption_id: ConsumptionId,
        amount: Option<Quantity>,
        idempotency_key: Option<IdempotencyKey>,
        visible: &ActionSet,
    ) -> Result<Settled, EngineError> {
        let charge = self
            .find_charge(consumption_id)
            .await?
            .filter(|charge| visible.contains(&charge.action))
            .ok_or_else(|| EngineError::NotFound(format!("no consumption '{consumption_id}'")))?;
        let keys = SubjectKeys::new(&self.prefix, &charge.action, &charge.subject);
        let now = self.now();
        let control_key =
            keys::refunded_total(&self.prefix, keys.shard, &consumption_id.to_string());
        let refunded = self
            .refunded_so_far(&control_key, consumption_id, now)
            .await?;
        let total = charge.amount;
        let amount = amount.map_or(total.saturating_sub(refunded), Quantity::get);
        if amount == 0 {
            return self
                .refunded_already(&keys, consumption_id, idempotency_key.as_ref(), now)
                .await;
        }
        let entry = LedgerEntry {
            folded: Vec::new(),
            id: EntryId::new(),
            at: now,
            kind: EntryKind::Refund,
            action: charge.action.clone(),
            subject: charge.subject.clone(),
            amount,
            consumption_id: Some(consumption_id),
            hold_id: None,
            idempotency_key,
            policies: given(&charge.counters, amount, refunded + amount == total),
            attributes: charge.attributes.clone(),
            counters: Vec::new(),
            hold_expires_at: None,
            kept_answer: None,
            totals: Vec::new(),
        };
        let alerting = Some(charge.counters.as_slice());
        let request_for = |entry: &LedgerEntry| self.refund_give_back(&charge, entry, refunded);
        match self
            .apply(self.giving_back(keys.shard, entry, alerting, request_for))
            .await?
        {
            (entry, GivenBack::Done { .. }) => Ok(self.settled(entry, false).await),
            (_, GivenBack::Conflict(before)) => Err(EngineError::Conflict(format!(
                "refunding {amount} would exceed the charge of {total}: {before} refunded already"
            ))),
            (_, GivenBack::Replayed(kept)) => {
                let earlier = codec::decode_refund_record(&kept).map_err(StoreError::from)?;
                if earlier.amount != amount {
                    return Err(EngineError::Conflict(format!(
                        "idempotency key was used for a refund of {}, not {amount}",
                        earlier.amount
                    )));
                }
                Ok(self.settled(earlier, true).await)
            }
            (_, GivenBack::Unknown) => Err(EngineError::NotFound(format!(
                "no consumption '{consumption_id}'"
            ))),
        }
    }

    /// The answer to a refund of the rest of `consumption_id` when nothing is left: the
    /// refund kept under `idempotency_key` replayed (a retry of a refund of the rest that
    /// stood), or a conflict.
    async fn refunded_already(
        &self,
        keys: &SubjectKeys,
        consumption_id: ConsumptionId,
        idempotency_key: Option<&IdempotencyKey>,
        now: DateTime<Utc>,
    ) -> Result<Settled, EngineError> {
        if let Some(key) = idempotency_key {
            let record_key = keys.idempotency('r', &format!("{consumption_id}:{key}"));
            let kept = self
                .counters
                .record(&record_key, now.timestamp_millis())
                .await?;
            if let Some(kept) = kept {
                let earlier = codec::decode_refund_record(&kept).map_err(StoreError::from)?;
                return Ok(self.settled(earlier, true).await);
            }
        }
        Err(EngineError::Conflict(format!(
            "consumption '{consumption_id}' has been refunded in full already"
        )))
    }

    /// The store's request for the refund `entry` of `charge`, `refunded` having been
    /// refunded before it (per the ledger: the store's running total wins if it has one).
    pub(in crate::engine) fn refund_give_back(
        &self,
        charge: &LedgerEntry,
        entry: &LedgerEntry,
        refunded: u64,
    ) -> GiveBack {
        let keys = SubjectKeys::new(&self.prefix, &charge.action, &charge.subject);
        let consumption_id = entry
            .consumption_id
            .map(|id| id.to_string())
            .unwrap_or_default();
        GiveBack {
            kind: GiveBackKind::Refund {
                amount: entry.amount,
                total: charge.amount,
                refunded,
            },
            pending: None,
            reports_usage: false,
            control_key: keys::refunded_total(&self.prefix, keys.shard, &consumption_id),
            hold_index: None,
            counters: charge.counters.clone(),
            ledger: self.pipeline.stream_entry(keys.shard, entry),
            idempotency: entry.idempotency_key.as_ref().map(|key| IdempotencyRecord {
                key: keys.idempotency('r', &format!("{consumption_id}:{key}")),
                ttl_ms: REFUND_IDEMPOTENCY_MS,
                record: codec::encode_entry(entry),
                pending: false,
            }),
        }
    }

    /// What was refunded of a consumption before now. The store's running total is
    /// current; the ledger may lag it (Redis drains later) but outlives it. The script
    /// checks again, atomically, so this only sets defaults.
    async fn refunded_so_far(
        &self,
        control_key: &str,
        consumption_id: ConsumptionId,
        now: DateTime<Utc>,
    ) -> Result<u64, EngineError> {
        let kept = self
            .counters
            .record(control_key, now.timestamp_millis())
            .await?;
        match kept.and_then(|t| t.parse::<u64>().ok()) {
            Some(total) => Ok(total),
            None => Ok(self.ledger.refunded(consumption_id).await?),
        }
    }

    /// The charge entry of a consumption; drains the Redis streams first if it is not in SQL.
    async fn find_charge(
        &self,
        consumption_id: ConsumptionId,
    ) -> Result<Option<LedgerEntry>, EngineError> {
        if let Some(entry) = self.ledger.charge_of(consumption_id).await? {
            return Ok(Some(entry));
        }
        if self.pipeline.settle_streams().await? {
            return Ok(self.ledger.charge_of(consumption_id).await?);
        }
        Ok(None)
    }
}
