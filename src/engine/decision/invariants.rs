//! The invariants of a unit of work, checked where they must hold, as TigerBeetle asserts
//! its own: a violation is a bug of this program, never of the request. At a unit's
//! boundary it stops that unit before the store is called ([`EngineError::Broken`]: a 500,
//! its cause logged once, nothing changed or recorded); in the hot path's arithmetic it is a
//! `debug_assert!`, which every test run checks.

use crate::domain::LedgerEntry;
use crate::engine::store::{Algorithm, Charge, GiveBack, GiveBackKind};
use crate::engine::EngineError;

/// What the allowed `entries` of a unit record as charged is what its `charges` (a plan's)
/// charge, counter by counter (requests decided together: their entries' sum): no charge of
/// a counter (all but per-request maximums, which keep none) without its entries, and no
/// entry recording a charge the plan does not make.
pub(in crate::engine) fn charged_as_planned<'a>(
    charges: impl IntoIterator<Item = &'a Charge>,
    entries: impl IntoIterator<Item = &'a LedgerEntry>,
) -> Result<(), EngineError> {
    let mut unrecorded: Vec<(&str, u64)> = charges
        .into_iter()
        .filter(|charge| charge.algorithm != Algorithm::Request)
        .map(|charge| (charge.key.as_str(), charge.cost))
        .collect();
    for entry in entries {
        for counter in &entry.counters {
            let left = unrecorded
                .iter_mut()
                .find(|(key, _)| *key == counter.key)
                .and_then(|(_, cost)| {
                    *cost = cost.checked_sub(counter.charged)?;
                    Some(())
                });
            if left.is_none() {
                return Err(EngineError::Broken(format!(
                    "entry {} records {} charged to {}, more than the decision charges",
                    entry.id, counter.charged, counter.key
                )));
            }
        }
    }
    match unrecorded.iter().find(|(_, cost)| *cost > 0) {
        None => Ok(()),
        Some((key, cost)) => Err(EngineError::Broken(format!(
            "the decision charges {cost} to {key} that no entry records"
        ))),
    }
}

/// A give-back never gives more than was charged: what its `entry` records as given back
/// to each policy is at most what that policy's counter of the charge (`request`'s) was
/// charged, and a settlement or void gives back at most the amount held or charged (a
/// commit keeps at most the hold, unless it over-captures, whose entry records the excess
/// as charged instead).
pub(in crate::engine) fn given_within_charged(
    request: &GiveBack,
    entry: &LedgerEntry,
) -> Result<(), EngineError> {
    let within = match request.kind {
        // What is left to refund is the store's to decide, atomically (a conflict).
        GiveBackKind::Refund { .. } => true,
        GiveBackKind::Commit { settle, total, .. } if settle > total => return Ok(()),
        GiveBackKind::Commit { total, .. }
        | GiveBackKind::Release { total, .. }
        | GiveBackKind::Expire { total, .. }
        | GiveBackKind::Void { total }
        | GiveBackKind::VoidHold { total, .. } => entry.amount <= total,
        GiveBackKind::Abandon
        | GiveBackKind::Undo
        | GiveBackKind::Resolved
        | GiveBackKind::RestoreOnce { .. } => true,
    };
    if !within {
        return Err(EngineError::Broken(format!(
            "entry {} gives back more of its charge than it holds ({:?})",
            entry.id, request.kind
        )));
    }
    for given in &entry.policies {
        let charged = request
            .counters
            .iter()
            .filter(|c| c.policy_id == given.policy_id && c.scope == given.scope)
            .map(|c| c.charged)
            .max();
        if charged.is_none_or(|charged| given.amount > charged) {
            return Err(EngineError::Broken(format!(
                "entry {} gives {} back to policy '{}', which its charge charged {}",
                entry.id,
                given.amount,
                given.policy_id,
                charged.unwrap_or(0)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::CounterKey;

    #[test]
    fn a_unit_whose_entries_do_not_record_its_charges_is_broken() {
        let entry = crate::engine::codec::tests::three_budget_charge();
        let mut charges: Vec<Charge> = entry
            .counters
            .iter()
            .map(|counter| Charge {
                key: CounterKey::read(&counter.key),
                algorithm: Algorithm::Lifetime,
                limit: 10,
                cost: counter.charged,
                enforce: true,
            })
            .collect();
        let broken = |charges: &[Charge], entries: &[LedgerEntry]| {
            matches!(
                charged_as_planned(charges, entries),
                Err(EngineError::Broken(_))
            )
        };
        assert!(charged_as_planned(&charges, [&entry]).is_ok());
        // Two requests decided together: one charge of their sum, an entry each.
        let doubled: Vec<Charge> = charges
            .iter()
            .map(|c| Charge {
                cost: 2 * c.cost,
                ..c.clone()
            })
            .collect();
        assert!(charged_as_planned(&doubled, [&entry, &entry]).is_ok());
        assert!(broken(&doubled, std::slice::from_ref(&entry)));
        let mut more = entry.clone();
        more.counters[0].charged += 1;
        assert!(broken(&charges, &[more]));
        let mut none = entry.clone();
        none.counters.clear();
        assert!(broken(&charges, &[none]));
        // A per-request maximum keeps no counter: nothing to record.
        charges.push(Charge {
            key: CounterKey::read("ql{0}request"),
            algorithm: Algorithm::Request,
            limit: 10,
            cost: 5,
            enforce: true,
        });
        assert!(charged_as_planned(&charges, [&entry]).is_ok());
    }

    #[test]
    fn a_give_back_that_gives_more_than_was_charged_is_broken() {
        // A charge of 500 to three amount policies.
        let mut charge = crate::engine::codec::tests::three_budget_charge();
        charge.amount = 500;
        for counter in &mut charge.counters {
            (counter.by_amount, counter.charged) = (true, 500);
        }
        let request = |kind| GiveBack {
            kind,
            control_key: String::new(),
            hold_index: None,
            counters: charge.counters.clone(),
            ledger: None,
            idempotency: None,
            pending: None,
            reports_usage: false,
        };
        let refund = |amount| {
            let mut entry = charge.clone();
            entry.amount = amount;
            // What each amount policy gets back: at most its charge.
            let given = |c: &crate::domain::CounterCharge| crate::domain::PolicyAmount {
                policy_id: c.policy_id.clone(),
                amount: amount.min(c.charged),
                scope: c.scope.clone(),
            };
            entry.policies = charge.counters.iter().map(given).collect();
            entry
        };
        let kind = GiveBackKind::Refund {
            amount: 1,
            total: charge.amount,
            refunded: 0,
        };
        assert!(given_within_charged(&request(kind), &refund(1)).is_ok());
        // Asked for more than was charged: the store refuses it, the entry gives no more.
        assert!(given_within_charged(&request(kind), &refund(charge.amount * 3)).is_ok());
        let mut more = refund(1);
        more.policies[0].amount = charge.counters[0].charged + 1;
        assert!(matches!(
            given_within_charged(&request(kind), &more),
            Err(EngineError::Broken(_))
        ));
        let mut elsewhere = refund(1);
        elsewhere.policies[0].policy_id =
            crate::domain::PolicyId::parse("policy_id", "another").expect("an id");
        assert!(given_within_charged(&request(kind), &elsewhere).is_err());
        // A release gives the whole hold back, never more.
        let release = |total| GiveBackKind::Release {
            total,
            expires_at_ms: 0,
        };
        let mut whole = refund(charge.amount);
        assert!(given_within_charged(&request(release(charge.amount)), &whole).is_ok());
        whole.amount += 1;
        assert!(given_within_charged(&request(release(charge.amount)), &whole).is_err());
    }
}
