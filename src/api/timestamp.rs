//! RFC 3339 timestamps in answers, written byte for byte as chrono's serde support writes
//! them, but without the formatting machinery.
//!
//! chrono serializes a `DateTime<Utc>` through `core::fmt` one character at a time, and
//! serde_json escapes each piece as it comes: that cost as much as the rest of a policy's
//! entry in the consume answer. Years 0 to 9999 are written here from a stack buffer; any
//! other year (reached only by a saturated shadow token bucket) goes to chrono itself.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Serialize, Serializer};

/// [`serialize`] for an optional time: `null` when absent.
pub(crate) fn serialize_optional<S: Serializer>(
    at: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => serialize(at, serializer),
        None => serializer.serialize_none(),
    }
}

/// Serializes `at` as chrono does: `YYYY-MM-DDTHH:MM:SS`, then `.mmm`, `.uuuuuu` or
/// `.nnnnnnnnn` when the second has a fraction (the shortest exact one), then `Z`.
pub(crate) fn serialize<S: Serializer>(
    at: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let year = at.year();
    if !(0..=9999).contains(&year) {
        return at.serialize(serializer);
    }
    let mut second = at.second();
    let mut nano = at.nanosecond();
    if nano >= 1_000_000_000 {
        // A leap second, which chrono writes as second 60.
        second += 1;
        nano -= 1_000_000_000;
    }
    let fraction = match nano {
        0 => None,
        n if n % 1_000_000 == 0 => Some((n / 1_000_000, 3)),
        n if n % 1_000 == 0 => Some((n / 1_000, 6)),
        n => Some((n, 9)),
    };
    let mut out = Buffer::default();
    out.digits(year.unsigned_abs(), 4);
    out.byte(b'-');
    out.digits(at.month(), 2);
    out.byte(b'-');
    out.digits(at.day(), 2);
    out.byte(b'T');
    out.digits(at.hour(), 2);
    out.byte(b':');
    out.digits(at.minute(), 2);
    out.byte(b':');
    out.digits(second, 2);
    if let Some((value, digits)) = fraction {
        out.byte(b'.');
        out.digits(value, digits);
    }
    out.byte(b'Z');
    serializer.serialize_str(out.as_str())
}

/// Room for the longest timestamp written here: `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
#[derive(Default)]
struct Buffer {
    bytes: [u8; 30],
    len: usize,
}

impl Buffer {
    fn byte(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    /// Appends the last `count` decimal digits of `value`, zero-padded.
    fn digits(&mut self, value: u32, count: u32) {
        for place in (0..count).rev() {
            // One decimal digit, below 10.
            self.byte(b'0' + (value / 10_u32.pow(place) % 10) as u8);
        }
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits and separators are ever written.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, TimeZone};
    use proptest::prelude::*;

    #[derive(serde::Serialize)]
    struct Ours(#[serde(serialize_with = "serialize")] DateTime<Utc>);

    fn instant(secs: i64, nanos: u32) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, nanos)
            .single()
            .expect("in chrono's range")
    }

    fn ours(at: DateTime<Utc>) -> String {
        serde_json::to_string(&Ours(at)).expect("serializes")
    }

    fn chronos(at: DateTime<Utc>) -> String {
        serde_json::to_string(&at).expect("serializes")
    }

    #[test]
    fn timestamps_read_exactly_as_chrono_writes_them() {
        let leap = NaiveDate::from_ymd_opt(2016, 12, 31)
            .and_then(|d| d.and_hms_nano_opt(23, 59, 59, 1_500_000_000))
            .expect("a leap second")
            .and_utc();
        for (at, text) in [
            (instant(0, 0), "\"1970-01-01T00:00:00Z\""),
            (
                instant(1_795_237_200, 123_000_000),
                "\"2026-11-21T05:00:00.123Z\"",
            ),
            (
                instant(1_795_237_200, 120_000),
                "\"2026-11-21T05:00:00.000120Z\"",
            ),
            (leap, "\"2016-12-31T23:59:60.500Z\""),
            (
                instant(-62_167_219_200, 7),
                "\"0000-01-01T00:00:00.000000007Z\"",
            ),
            (instant(-62_167_219_201, 0), "\"-0001-12-31T23:59:59Z\""),
            (
                instant(253_402_300_800, 5_000_000),
                "\"+10000-01-01T00:00:00.005Z\"",
            ),
        ] {
            assert_eq!(ours(at), text);
            assert_eq!(chronos(at), text);
        }
    }

    proptest! {
        #[test]
        fn any_instant_reads_as_chrono_writes_it(
            secs in -70_000_000_000_i64..260_000_000_000,
            nanos in prop_oneof![Just(0_u32), (0_u32..1_000).prop_map(|m| m * 1_000_000),
                (0_u32..1_000_000).prop_map(|u| u * 1_000), 0_u32..2_000_000_000],
        ) {
            let at = instant(secs, nanos.min(999_999_999));
            prop_assert_eq!(ours(at), chronos(at));
        }
    }
}
