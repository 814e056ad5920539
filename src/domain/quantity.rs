//! Whole quantities (limits, amounts, usage) in integer minor units.

use super::FieldError;
use std::fmt;

/// The largest integer exactly representable in JSON numbers and Redis Lua (2^53 - 1).
pub const MAX_SAFE: u64 = (1 << 53) - 1;

/// A whole number in `[0, 2^53 - 1]`: a limit, an amount or a usage, in minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity(u64);

impl Quantity {
    /// Zero units.
    pub(crate) const ZERO: Quantity = Quantity(0);

    /// Parses any integer, naming `field` in the error when it is out of range.
    pub(crate) fn parse(field: &str, value: i128) -> Result<Self, FieldError> {
        if (0..=i128::from(MAX_SAFE)).contains(&value) {
            Ok(Self(value as u64))
        } else {
            Err(FieldError::new(
                field,
                format!("must be a whole number between 0 and {MAX_SAFE}"),
            ))
        }
    }

    /// Parses an amount to charge: like [`Quantity::parse`] but at least 1.
    pub(crate) fn parse_amount(field: &str, value: i128) -> Result<Self, FieldError> {
        if value < 1 {
            return Err(FieldError::new(field, "must be at least 1"));
        }
        Self::parse(field, value)
    }

    /// Builds a quantity from a trusted source (a store), clamping to the safe range.
    pub fn saturating(value: u64) -> Self {
        Self(value.min(MAX_SAFE))
    }

    /// The number of units.
    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_bounded_by_the_safe_integer_range() {
        assert_eq!(Quantity::parse("limit", 0).map(Quantity::get), Ok(0));
        assert_eq!(
            Quantity::parse("limit", i128::from(MAX_SAFE)).map(Quantity::get),
            Ok(MAX_SAFE)
        );
        assert!(Quantity::parse("limit", 1 << 53).is_err());
        assert!(Quantity::parse("limit", -1).is_err());
        assert!(Quantity::parse_amount("amount", 0).is_err());
        assert_eq!(
            Quantity::parse_amount("amount", 1).map(Quantity::get),
            Ok(1)
        );
    }
}
