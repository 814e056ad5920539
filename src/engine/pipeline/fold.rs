//! Folding: the rows of consumes recorded in the ledger's totals, many into one.
//!
//! A consume whose policies all record `totals` (and that carries no idempotency key) is
//! not an entry of the ledger's API: what the book of record needs of it is its share of
//! the counters (to rebuild, check and checkpoint them) and of the totals. So such
//! consumes go into SQL folded: those of one group commit of the embedded default's
//! writer, or of one move of a shard's waiting consumes from Redis (`drain::moves`), as
//! one row per action, kind and minute. A row holds the counters they charged, summed per
//! counter and period; their totals, summed per budget and period; and their entries'
//! ids (`folded`). A few rows per commit, rather than a row, its indexes and its triggers
//! per request.
//!
//! A folded row names no subject of its consumes (its subject is [`FOLDED_SUBJECT`]); its
//! `policies` name each policy and scope once, with the units they were charged summed.
//! It is made when its first consume was (`at`), so a replay meets it before any void of
//! one of them. Everything that reads the ledger as counters reads it as it read the rows
//! it folds: a replay adds each counter's sum at once, where the rows added it a request
//! at a time. A consume that keeps an answer (an alert's crossing) is never folded.

use crate::domain::{
    CounterCharge, EntryId, EntryKind, LedgerEntry, PolicyAmount, Subject, TotalLine,
};
use crate::engine::store::MAX_UNITS;
use std::collections::HashMap;

/// The subject of a folded row (it stands for the consumes of many subjects).
pub(crate) const FOLDED_SUBJECT: &str = "*";

/// Consumes per folded row at most, so that a row stays a few hundred kilobytes.
const MAX_FOLDED: u64 = 2_000;

/// Whether `entry` may be folded: a charge or denial recorded in the totals, with no
/// answer kept, no hold and no idempotency key, not folded already.
pub(crate) fn foldable(entry: &LedgerEntry) -> bool {
    matches!(entry.kind, EntryKind::Charge | EntryKind::Deny)
        && !entry.totals.is_empty()
        && entry.folded.is_empty()
        && entry.kept_answer.is_none()
        && entry.idempotency_key.is_none()
        && entry.hold_id.is_none()
}

/// `entries` with the [`foldable`] ones folded, each folded row a new id: the others
/// first, in their order, then one row per action, kind and minute (more when one would
/// pass [`MAX_FOLDED`] consumes or [`MAX_UNITS`] units). `None` when there is nothing to
/// fold (fewer than two).
pub(crate) fn fold(entries: &[LedgerEntry]) -> Option<Vec<LedgerEntry>> {
    if entries.iter().filter(|e| foldable(e)).take(2).count() < 2 {
        return None;
    }
    Some(fold_with(entries, |_| EntryId::new()))
}

/// `entries` moved together from a counter store (`content` names what they are, once:
/// the same content moved again gives the same rows), folded: every folded row's id is
/// derived from `content` and its place, the entries taken in the order of their ids. A
/// part of the content moved again (a Redis restored from an older snapshot) makes at
/// most as many rows, so its rows' ids are among those of the whole: inserted once.
pub(crate) fn fold_moved(mut entries: Vec<LedgerEntry>, content: EntryId) -> Vec<LedgerEntry> {
    entries.sort_by_key(|e| e.id);
    let bits = content.to_bits();
    fold_with(&entries, |k| {
        let place = u128::try_from(k).unwrap_or(u128::MAX);
        EntryId::from_bits(bits ^ (place.wrapping_add(1) << 64).rotate_left(17))
    })
}

/// The folding of [`fold`] and [`fold_moved`]; `id` names the `k`-th folded row.
fn fold_with(entries: &[LedgerEntry], mut id: impl FnMut(usize) -> EntryId) -> Vec<LedgerEntry> {
    let mut out = Vec::new();
    let mut open: HashMap<(&str, EntryKind, i64), Folding> = HashMap::new();
    let mut done = Vec::new();
    for entry in entries {
        if !foldable(entry) {
            out.push(entry.clone());
            continue;
        }
        let minute = entry.at.timestamp().div_euclid(60);
        let group = (entry.action.as_str(), entry.kind, minute);
        let full = open.get(&group).is_some_and(|f| !f.fits(entry));
        if full {
            done.extend(open.remove(&group).map(Folding::finish));
        }
        match open.get_mut(&group) {
            Some(folding) => folding.add(entry),
            None => {
                open.insert(group, Folding::start(entry));
            }
        }
    }
    done.extend(open.into_values().map(Folding::finish));
    done.sort_by(|a, b| {
        (a.at, a.action.as_str(), a.kind.as_str()).cmp(&(b.at, b.action.as_str(), b.kind.as_str()))
    });
    for (k, mut row) in done.into_iter().enumerate() {
        row.id = id(k);
        out.push(row);
    }
    out
}

/// A folded row being gathered.
struct Folding {
    row: LedgerEntry,
    /// Position in `row.policies` per policy and scope.
    policies: HashMap<PolicyAmount, usize>,
    /// Position in `row.counters` per counter, without its units.
    counters: HashMap<CounterCharge, usize>,
    /// Position in `row.totals` per line, without its numbers.
    totals: HashMap<TotalLine, usize>,
}

impl Folding {
    fn start(first: &LedgerEntry) -> Self {
        let subject = Subject::parse("subject", FOLDED_SUBJECT).expect("a valid subject");
        let mut folding = Self {
            row: LedgerEntry {
                id: EntryId::new(),
                at: first.at,
                kind: first.kind,
                action: first.action.clone(),
                subject,
                amount: 0,
                consumption_id: None,
                hold_id: None,
                idempotency_key: None,
                policies: Vec::new(),
                attributes: Default::default(),
                counters: Vec::new(),
                hold_expires_at: None,
                kept_answer: None,
                totals: Vec::new(),
                folded: Vec::new(),
            },
            policies: HashMap::new(),
            counters: HashMap::new(),
            totals: HashMap::new(),
        };
        folding.add(first);
        folding
    }

    /// Whether `entry` may join this row.
    fn fits(&self, entry: &LedgerEntry) -> bool {
        (self.row.folded.len() as u64) < MAX_FOLDED && entry.amount <= MAX_UNITS - self.row.amount
    }

    fn add(&mut self, entry: &LedgerEntry) {
        let row = &mut self.row;
        // The row is replayed when its first consume was made: before any void of them.
        row.at = row.at.min(entry.at);
        row.amount += entry.amount;
        row.folded.push(entry.id);
        for policy in &entry.policies {
            let unit = PolicyAmount {
                amount: 0,
                ..policy.clone()
            };
            let at = *self.policies.entry(unit).or_insert_with(|| {
                row.policies.push(PolicyAmount {
                    amount: 0,
                    ..policy.clone()
                });
                row.policies.len() - 1
            });
            let summed = &mut row.policies[at].amount;
            *summed = summed.saturating_add(policy.amount).min(MAX_UNITS);
        }
        for counter in &entry.counters {
            let unit = CounterCharge {
                charged: 0,
                ..counter.clone()
            };
            let at = *self.counters.entry(unit).or_insert_with(|| {
                row.counters.push(CounterCharge {
                    charged: 0,
                    ..counter.clone()
                });
                row.counters.len() - 1
            });
            let summed = &mut row.counters[at].charged;
            *summed = summed.saturating_add(counter.charged).min(MAX_UNITS);
        }
        for line in &entry.totals {
            let unit = TotalLine {
                amount: 0,
                allowed: 0,
                denied: 0,
                ..line.clone()
            };
            let at = *self.totals.entry(unit.clone()).or_insert_with(|| {
                row.totals.push(unit);
                row.totals.len() - 1
            });
            let summed = &mut row.totals[at];
            summed.amount = summed.amount.saturating_add(line.amount);
            summed.allowed = summed.allowed.saturating_add(line.allowed);
            summed.denied = summed.denied.saturating_add(line.denied);
        }
    }

    fn finish(self) -> LedgerEntry {
        self.row
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::KeptAnswer;
    use crate::engine::codec::tests::three_budget_charge;

    /// A consume recorded in the totals: three budgets, a total line each.
    fn totalled(subject: &str) -> LedgerEntry {
        let mut entry = three_budget_charge();
        entry.id = EntryId::new();
        entry.kind = EntryKind::Charge;
        (entry.idempotency_key, entry.kept_answer, entry.hold_id) = (None, None, None);
        entry.subject = Subject::parse("subject", subject).expect("a subject");
        entry.totals = entry
            .policies
            .iter()
            .map(|p| TotalLine {
                policy_id: p.policy_id.clone(),
                budget: subject.to_owned(),
                period_end: entry.at,
                amount: 1,
                allowed: 1,
                denied: 0,
            })
            .collect();
        entry
    }

    #[test]
    fn consumes_recorded_in_totals_fold_into_one_row_with_their_sums() {
        let (a, b) = (totalled("u1"), totalled("u2"));
        let mut kept = totalled("u3");
        kept.kept_answer = Some(KeptAnswer {
            text: "x".into(),
            expires_at_ms: 0,
        });
        let mut plain = totalled("u4");
        plain.totals.clear();
        let out = fold(&[a.clone(), kept.clone(), b.clone(), plain.clone()]).expect("folded");
        // The others first, as they came; then the folded row.
        assert_eq!(out[..2], [kept, plain]);
        let row = &out[2];
        assert_eq!(row.folded, [a.id, b.id]);
        assert_eq!(row.subject.as_str(), FOLDED_SUBJECT);
        assert_eq!(row.amount, 2);
        // The three counters are the same keys in both (the fixture's): summed, in order.
        assert_eq!(row.counters.len(), 3);
        assert!(row.counters.iter().all(|c| c.charged == 2));
        assert_eq!(row.counters[1].scope, a.counters[1].scope);
        // One policy each, its units summed; one total line per budget.
        let policies: Vec<(&str, u64)> = row
            .policies
            .iter()
            .map(|p| (p.policy_id.as_str(), p.amount))
            .collect();
        assert_eq!(
            policies,
            [("sms-user", 2), ("sms-country", 2), ("sms-global", 2)]
        );
        assert_eq!(row.totals.len(), 6);
        assert!(row.totals.iter().all(|t| (t.amount, t.allowed) == (1, 1)));
    }

    #[test]
    fn denials_fold_apart_from_charges_and_one_consume_is_left_as_it_is() {
        assert_eq!(fold(&[totalled("u1")]), None);
        let mut denied = totalled("u2");
        denied.kind = EntryKind::Deny;
        denied.counters.clear();
        let out = fold(&[totalled("u1"), denied.clone(), totalled("u3"), denied]).expect("folded");
        let kinds: Vec<(EntryKind, usize)> = out.iter().map(|e| (e.kind, e.folded.len())).collect();
        assert!(kinds.contains(&(EntryKind::Charge, 2)), "{kinds:?}");
        assert!(kinds.contains(&(EntryKind::Deny, 2)), "{kinds:?}");
        assert_eq!(out.len(), 2);
    }
}
