//! Window definitions: how a policy's usage is grouped in time.

use super::FieldError;
use chrono::Weekday;
use chrono_tz::Tz;
use std::fmt;

/// The most buckets a rolling window may have (one a minute over a day).
pub const MAX_BUCKETS: u64 = 1_440;

/// The longest rolling or token-bucket window: 366 days.
pub const MAX_WINDOW_SECONDS: u64 = 366 * 24 * 3_600;

/// A calendar period; usage resets at each of its boundaries in the policy's time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarPeriod {
    /// Each wall-clock minute.
    Minute,
    /// Each wall-clock hour (a DST shift may make one longer or shorter).
    Hour,
    /// Each local calendar day: 23, 24 or 25 hours long.
    Day,
    /// Each ISO week, starting Monday at local midnight.
    Week,
    /// Each calendar month.
    Month,
    /// Each calendar year.
    Year,
}

impl CalendarPeriod {
    /// Parses the wire name (`minute`, `hour`, `day`, `week`, `month`).
    pub(crate) fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        Ok(match value {
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => {
                return Err(FieldError::new(
                    field,
                    "must be one of minute, hour, day, week, month, year",
                ))
            }
        })
    }

    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }
}

/// Where a calendar period starts, beyond the wall clock's own units: the bank's 04:00
/// cut-off, weeks from Sunday, a billing month from the 15th. The default (Monday, 00:00,
/// the 1st, January) is the plain calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Anchors {
    /// The day a week starts on (`week` periods).
    pub week_start: Weekday,
    /// Minutes after local midnight at which a day starts (0-1439); a week, month or year
    /// starts at that time of its first day too.
    pub day_start: u16,
    /// The day of the month a month or year starts on (1-31), clamped to a shorter month's
    /// last day.
    pub month_day: u8,
    /// The month a year starts in (1-12).
    pub year_month: u8,
}

impl Default for Anchors {
    fn default() -> Self {
        Self {
            week_start: Weekday::Mon,
            day_start: 0,
            month_day: 1,
            year_month: 1,
        }
    }
}

/// The anchors of a calendar window as given: each `None` when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnchorsInput<'a> {
    /// `monday` … `sunday`.
    pub week_start: Option<&'a str>,
    /// `"HH:MM"`.
    pub day_start: Option<&'a str>,
    /// 1-31.
    pub month_day: Option<i64>,
    /// 1-12.
    pub year_month: Option<i64>,
}

const WEEKDAYS: [(&str, Weekday); 7] = [
    ("monday", Weekday::Mon),
    ("tuesday", Weekday::Tue),
    ("wednesday", Weekday::Wed),
    ("thursday", Weekday::Thu),
    ("friday", Weekday::Fri),
    ("saturday", Weekday::Sat),
    ("sunday", Weekday::Sun),
];

impl Anchors {
    /// Whether these are the plain calendar's anchors.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Parses the anchors of a `period` window, naming the field of each error: an anchor
    /// the period does not use is refused (a `day_start` on an hour would be meaningless).
    pub fn parse(period: CalendarPeriod, input: &AnchorsInput<'_>) -> Result<Self, FieldError> {
        use CalendarPeriod::{Hour, Minute, Month, Week, Year};
        let mut anchors = Self::default();
        let refuse = |field: &str, periods: &str| {
            Err(FieldError::new(
                field,
                format!("applies to {periods} periods only, not to a {period} period"),
            ))
        };
        if let Some(text) = input.week_start {
            if period != Week {
                return refuse("week_start", "week");
            }
            anchors.week_start = WEEKDAYS
                .iter()
                .find(|(name, _)| *name == text)
                .map(|(_, day)| *day)
                .ok_or_else(|| {
                    FieldError::new(
                        "week_start",
                        "must be monday, tuesday, wednesday, thursday, friday, saturday or sunday",
                    )
                })?;
        }
        if let Some(text) = input.day_start {
            if matches!(period, Minute | Hour) {
                return refuse("day_start", "day, week, month and year");
            }
            anchors.day_start = parse_time_of_day(text).ok_or_else(|| {
                FieldError::new(
                    "day_start",
                    format!("'{text}' must be a local time HH:MM, from 00:00 to 23:59"),
                )
            })?;
        }
        if let Some(day) = input.month_day {
            if !matches!(period, Month | Year) {
                return refuse("month_day", "month and year");
            }
            anchors.month_day = u8::try_from(day)
                .ok()
                .filter(|d| (1..=31).contains(d))
                .ok_or_else(|| {
                    FieldError::new("month_day", "must be a day of the month, 1 to 31")
                })?;
        }
        if let Some(month) = input.year_month {
            if period != Year {
                return refuse("year_month", "year");
            }
            anchors.year_month = u8::try_from(month)
                .ok()
                .filter(|m| (1..=12).contains(m))
                .ok_or_else(|| FieldError::new("year_month", "must be a month, 1 to 12"))?;
        }
        Ok(anchors)
    }

    /// The wire name of the week's first day.
    pub fn week_start_name(&self) -> &'static str {
        WEEKDAYS
            .iter()
            .find(|(_, day)| *day == self.week_start)
            .map_or("monday", |(name, _)| name)
    }

    /// The day's start as `"HH:MM"`.
    pub fn day_start_text(&self) -> String {
        format!("{:02}:{:02}", self.day_start / 60, self.day_start % 60)
    }
}

/// Minutes after midnight of `"HH:MM"` (00:00-23:59); `None` otherwise.
fn parse_time_of_day(text: &str) -> Option<u16> {
    let (hours, minutes) = text.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: u16 = hours.parse().ok()?;
    let minutes: u16 = minutes.parse().ok()?;
    (hours < 24 && minutes < 60).then_some(hours * 60 + minutes)
}

impl fmt::Display for CalendarPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How usage is grouped in time; valid by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// One counter per calendar period in an IANA time zone.
    Calendar {
        /// Which period.
        period: CalendarPeriod,
        /// The zone whose wall clock defines the boundaries.
        timezone: Tz,
        /// Where each period starts (the plain calendar by default).
        anchors: Anchors,
    },
    /// A trailing window of `seconds`, counted in buckets of `bucket_seconds`.
    Rolling {
        /// Window length W in seconds.
        seconds: u64,
        /// Bucket length B in seconds; divides W.
        bucket_seconds: u64,
    },
    /// `limit` units per `seconds`, refilled smoothly (GCRA).
    TokenBucket {
        /// The refill period in seconds.
        seconds: u64,
    },
    /// A per-request maximum (a card's "per authorization" limit): a request whose amount
    /// exceeds the limit is denied; nothing accumulates.
    Request,
    /// Usage that never resets (a prepaid card's lifetime cap); its counters keep no time
    /// to live and are rebuilt from the whole ledger.
    Lifetime,
}

fn positive_seconds(field: &str, value: i128) -> Result<u64, FieldError> {
    if (1..=i128::from(MAX_WINDOW_SECONDS)).contains(&value) {
        Ok(value as u64)
    } else {
        Err(FieldError::new(
            field,
            format!("must be a whole number of seconds between 1 and {MAX_WINDOW_SECONDS}"),
        ))
    }
}

impl Window {
    /// A calendar window; `timezone` is an IANA name (default `UTC` is the caller's).
    pub fn calendar(period: CalendarPeriod, timezone: &str) -> Result<Self, FieldError> {
        let timezone: Tz = timezone.parse().map_err(|_| {
            FieldError::new(
                "timezone",
                format!("'{timezone}' is not an IANA time zone name (e.g. Europe/Berlin)"),
            )
        })?;
        Ok(Self::Calendar {
            period,
            timezone,
            anchors: Anchors::default(),
        })
    }

    /// This window with `anchors` (a calendar window's; any other is returned as it is).
    pub fn anchored(self, with: Anchors) -> Self {
        match self {
            Self::Calendar {
                period, timezone, ..
            } => Self::Calendar {
                period,
                timezone,
                anchors: with,
            },
            other => other,
        }
    }

    /// A rolling window of `seconds` in buckets of `bucket_seconds` (which must divide it).
    pub(crate) fn rolling(seconds: i128, bucket_seconds: i128) -> Result<Self, FieldError> {
        let seconds = positive_seconds("seconds", seconds)?;
        let bucket_seconds = positive_seconds("bucket_seconds", bucket_seconds)?;
        if seconds % bucket_seconds != 0 {
            return Err(FieldError::new(
                "bucket_seconds",
                format!("must divide seconds ({seconds}) exactly"),
            ));
        }
        if seconds / bucket_seconds > MAX_BUCKETS {
            return Err(FieldError::new(
                "bucket_seconds",
                format!("gives more than {MAX_BUCKETS} buckets; use larger buckets"),
            ));
        }
        Ok(Self::Rolling {
            seconds,
            bucket_seconds,
        })
    }

    /// A token bucket refilling `limit` units every `seconds`.
    pub(crate) fn token_bucket(seconds: i128) -> Result<Self, FieldError> {
        Ok(Self::TokenBucket {
            seconds: positive_seconds("seconds", seconds)?,
        })
    }

    /// Checks that `limit` can be counted exactly in this window.
    ///
    /// A token bucket keeps its state as `used × period_ms`, which must stay below 2^53 so
    /// that Redis Lua (doubles) computes it exactly.
    pub(crate) fn check_limit(&self, field: &str, limit: u64) -> Result<(), FieldError> {
        if let Self::TokenBucket { seconds } = self {
            let max = super::MAX_SAFE / (seconds * 1_000);
            if limit > max {
                return Err(FieldError::new(
                    field,
                    format!("must be at most {max} for a token bucket of {seconds} s"),
                ));
            }
        }
        Ok(())
    }

    /// A short text that changes whenever the window's meaning changes; part of counter keys.
    pub(crate) fn fingerprint(&self) -> String {
        match self {
            // The plain calendar keeps the keys it always had.
            Self::Calendar {
                period,
                timezone,
                anchors,
            } if anchors.is_default() => format!("c{}@{}", period, timezone.name()),
            Self::Calendar {
                period,
                timezone,
                anchors,
            } => format!(
                "c{}@{}+{}{}/{}/{}",
                period,
                timezone.name(),
                anchors.week_start.num_days_from_monday(),
                anchors.day_start,
                anchors.month_day,
                anchors.year_month
            ),
            Self::Rolling {
                seconds,
                bucket_seconds,
            } => format!("r{seconds}/{bucket_seconds}"),
            Self::TokenBucket { seconds } => format!("t{seconds}"),
            Self::Request => "q".to_owned(),
            Self::Lifetime => "l".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_windows_need_buckets_that_divide_them() {
        assert!(Window::rolling(86_400, 3_600).is_ok());
        assert_eq!(
            Window::rolling(86_400, 7_000).map_err(|e| e.field),
            Err("bucket_seconds".to_owned())
        );
        assert!(Window::rolling(86_400, 1).is_err(), "too many buckets");
        assert!(Window::rolling(0, 1).is_err());
        assert!(Window::rolling(60, -1).is_err());
    }

    #[test]
    fn calendar_windows_need_an_iana_zone() {
        assert!(Window::calendar(CalendarPeriod::Day, "America/New_York").is_ok());
        assert!(Window::calendar(CalendarPeriod::Day, "Mars/Olympus").is_err());
    }

    #[test]
    fn anchors_parse_for_the_periods_that_use_them_and_name_the_field_otherwise() {
        use CalendarPeriod::{Day, Hour, Month, Week, Year};
        let input = |week, day, month_day, year_month| AnchorsInput {
            week_start: week,
            day_start: day,
            month_day,
            year_month,
        };
        let ok = Anchors::parse(Year, &input(None, Some("04:00"), Some(15), Some(4)))
            .expect("valid anchors");
        assert_eq!((ok.day_start, ok.month_day, ok.year_month), (240, 15, 4));
        assert_eq!(ok.day_start_text(), "04:00");
        let sunday = Anchors::parse(Week, &input(Some("sunday"), None, None, None)).expect("valid");
        assert_eq!(sunday.week_start_name(), "sunday");
        for (period, given, field) in [
            (Hour, input(None, Some("02:30"), None, None), "day_start"),
            (Day, input(None, Some("24:00"), None, None), "day_start"),
            (Day, input(None, Some("4:00"), None, None), "day_start"),
            (Day, input(Some("sunday"), None, None, None), "week_start"),
            (Week, input(Some("sun"), None, None, None), "week_start"),
            (Week, input(None, None, Some(1), None), "month_day"),
            (Month, input(None, None, Some(32), None), "month_day"),
            (Month, input(None, None, Some(0), None), "month_day"),
            (Month, input(None, None, None, Some(1)), "year_month"),
            (Year, input(None, None, None, Some(13)), "year_month"),
        ] {
            let error = Anchors::parse(period, &given).expect_err("invalid");
            assert_eq!(error.field, field, "{period} {given:?}");
        }
        assert!(Anchors::parse(Month, &AnchorsInput::default())
            .expect("none given")
            .is_default());
    }

    #[test]
    fn anchors_change_the_fingerprint_and_the_plain_calendar_keeps_its_own() {
        let plain = Window::calendar(CalendarPeriod::Day, "UTC").expect("valid");
        assert_eq!(plain.fingerprint(), "cday@UTC");
        let cut_off = Anchors {
            day_start: 240,
            ..Anchors::default()
        };
        assert_ne!(plain.anchored(cut_off).fingerprint(), plain.fingerprint());
    }

    #[test]
    fn token_buckets_bound_the_limit_so_lua_stays_exact() {
        let w = Window::token_bucket(3_600).expect("valid");
        assert!(w.check_limit("limit", 1_000_000).is_ok());
        assert!(w.check_limit("limit", super::super::MAX_SAFE).is_err());
    }

    #[test]
    fn fingerprints_differ_when_the_window_does() {
        let a = Window::rolling(86_400, 3_600).expect("valid").fingerprint();
        let b = Window::rolling(86_400, 1_800).expect("valid").fingerprint();
        assert_ne!(a, b);
    }
}
