//! The invariants of a unit of work, checked where they must hold, as TigerBeetle asserts
//! its own: a violation is a bug of this program, never of the request. At a unit's
//! boundary it stops that unit before the store is called ([`EngineError::Broken`]: a 500,
//! its cause logged once, nothing changed or recorded); in the hot path's arithmetic it is a
//! `debug_assert!`, which every test run checks.

use crate::domain::LedgerEntry;
use crate::engine::store::{Algorithm, Charge};
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
}
