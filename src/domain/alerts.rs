//! Alert thresholds: the percents of a policy's limit at which a budget's usage is
//! reported (`alert_thresholds`), and when one decision crosses them.

use super::FieldError;

/// The most thresholds a policy may have.
pub const MAX_THRESHOLDS: usize = 8;

/// A policy's alert thresholds, percents of its limit (1-100), distinct and ascending;
/// empty when it alerts on nothing. Valid by construction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Thresholds(Vec<u8>);

impl Thresholds {
    /// Parses `percents` (as given in `field`): each 1-100, at most
    /// [`MAX_THRESHOLDS`], no repeats; kept in ascending order.
    pub fn parse(field: &str, percents: &[i64]) -> Result<Self, FieldError> {
        if percents.len() > MAX_THRESHOLDS {
            return Err(FieldError::new(
                field,
                format!("at most {MAX_THRESHOLDS} thresholds"),
            ));
        }
        let mut kept = Vec::with_capacity(percents.len());
        for (i, &percent) in percents.iter().enumerate() {
            let percent = u8::try_from(percent)
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| {
                    FieldError::new(
                        format!("{field}[{i}]"),
                        format!("must be a percent of the limit, 1 to 100, not {percent}"),
                    )
                })?;
            if kept.contains(&percent) {
                return Err(FieldError::new(
                    format!("{field}[{i}]"),
                    format!("{percent} is listed twice"),
                ));
            }
            kept.push(percent);
        }
        kept.sort_unstable();
        Ok(Self(kept))
    }

    /// The percents, ascending.
    pub fn percents(&self) -> &[u8] {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The thresholds that usage going from `before` to `after` reaches (upwards) or falls
    /// back below (downwards), against `limit`: a threshold of `p` percent is reached at
    /// `ceil(p × limit / 100)` units (5 of 10 for 50%). Each change of usage crosses a
    /// threshold at most once, so each crossing is reported by exactly one decision.
    pub fn crossed(&self, limit: u64, before: u64, after: u64) -> Vec<Crossing> {
        self.0
            .iter()
            .filter_map(|&percent| {
                let at = level(percent, limit);
                if at == 0 {
                    None // a limit of 0: reached before any usage, never crossed
                } else if before < at && at <= after {
                    Some(Crossing::Reached(percent))
                } else if after < at && at <= before {
                    Some(Crossing::Resolved(percent))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// The usage at which `percent` of `limit` is reached: `ceil(percent × limit / 100)`.
pub fn level(percent: u8, limit: u64) -> u64 {
    let exact = u128::from(percent) * u128::from(limit);
    u64::try_from(exact.div_ceil(100)).unwrap_or(u64::MAX)
}

/// One threshold crossed by one change of usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// Usage reached the threshold (`budget.threshold`).
    Reached(u8),
    /// Usage fell back below it (`budget.threshold.resolved`).
    Resolved(u8),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn thresholds_are_1_to_100_at_most_8_and_distinct() {
        let parsed = Thresholds::parse("alert_thresholds", &[100, 50, 80]).expect("valid");
        assert_eq!(parsed.percents(), &[50, 80, 100]);
        for (bad, field) in [
            (vec![0], "alert_thresholds[0]"),
            (vec![50, 101], "alert_thresholds[1]"),
            (vec![-5], "alert_thresholds[0]"),
            (vec![50, 50], "alert_thresholds[1]"),
            ((1..=9).collect(), "alert_thresholds"),
        ] {
            let error = Thresholds::parse("alert_thresholds", &bad).expect_err("refused");
            assert_eq!(error.field, field, "{bad:?}");
        }
    }

    #[test]
    fn ten_consumes_of_a_ten_per_day_budget_cross_50_and_100_once_each() {
        let thresholds = Thresholds::parse("t", &[50, 100]).expect("valid");
        let crossings: Vec<(u64, Vec<Crossing>)> = (1..=10)
            .map(|used| (used, thresholds.crossed(10, used - 1, used)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        assert_eq!(
            crossings,
            vec![
                (5, vec![Crossing::Reached(50)]),
                (10, vec![Crossing::Reached(100)])
            ]
        );
        assert_eq!(
            thresholds.crossed(10, 10, 4),
            vec![Crossing::Resolved(50), Crossing::Resolved(100)],
            "a refund of 6"
        );
        assert!(thresholds.crossed(0, 0, 5).is_empty(), "a limit of 0");
    }

    proptest! {
        /// Over any walk of usage, each threshold's reports alternate, reached first: never
        /// two reports of one crossing, and none missed.
        #[test]
        fn reports_alternate_and_match_the_level(
            limit in 1u64..=1_000,
            steps in prop::collection::vec(0u64..=1_200, 1..40),
        ) {
            let thresholds = Thresholds::parse("t", &[1, 33, 50, 99, 100]).expect("valid");
            let mut before = 0;
            let mut reached = [false; 5];
            for after in steps {
                for crossing in thresholds.crossed(limit, before, after) {
                    let (percent, up) = match crossing {
                        Crossing::Reached(p) => (p, true),
                        Crossing::Resolved(p) => (p, false),
                    };
                    let i = thresholds.percents().iter().position(|&p| p == percent).expect("one of them");
                    prop_assert_ne!(reached[i], up, "{} reported twice", percent);
                    reached[i] = up;
                }
                for (i, &percent) in thresholds.percents().iter().enumerate() {
                    prop_assert_eq!(reached[i], after >= level(percent, limit));
                }
                before = after;
            }
        }
    }
}
