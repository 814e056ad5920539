//! Page cursors: opaque to clients, the last `seq` served to us.
//!
//! A cursor is a version prefix and a hexadecimal `seq`; anything else is refused, so a
//! client cannot page with a value we did not hand out, and a future format can coexist.

use crate::engine::ledger::LedgerError;

/// The cursor's version prefix; the rest is the last `seq` served, in hex.
const CURSOR_PREFIX: &str = "s1.";

/// The cursor that continues after the entry with this `seq`.
pub(super) fn encode_cursor(seq: i64) -> String {
    format!("{CURSOR_PREFIX}{seq:x}")
}

/// The `seq` a cursor continues after; [`LedgerError::BadCursor`] if we did not make it.
pub(super) fn decode_cursor(cursor: &str) -> Result<i64, LedgerError> {
    let hex = cursor
        .strip_prefix(CURSOR_PREFIX)
        .ok_or(LedgerError::BadCursor)?;
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(LedgerError::BadCursor);
    }
    match i64::from_str_radix(hex, 16) {
        Ok(seq) if seq > 0 => Ok(seq),
        _ => Err(LedgerError::BadCursor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_anything_else_is_refused() {
        for seq in [1, 255, i64::MAX] {
            assert_eq!(decode_cursor(&encode_cursor(seq)).ok(), Some(seq));
        }
        for bad in [
            "",
            "s1.",
            "s1.0",
            "s1.-1",
            "s1.+1",
            "s1.zz",
            "s1. 1",
            "s2.1",
            "1",
            "s1.8000000000000000",
            "s1.00000000000000001",
        ] {
            assert!(
                matches!(decode_cursor(bad), Err(LedgerError::BadCursor)),
                "{bad:?} is refused"
            );
        }
    }
}
