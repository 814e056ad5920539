//! Window definitions: how a policy's usage is grouped in time.

use super::FieldError;
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
            _ => {
                return Err(FieldError::new(
                    field,
                    "must be one of minute, hour, day, week, month",
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
        }
    }
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
        Ok(Self::Calendar { period, timezone })
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
            Self::Calendar { period, timezone } => format!("c{}@{}", period, timezone.name()),
            Self::Rolling {
                seconds,
                bucket_seconds,
            } => format!("r{seconds}/{bucket_seconds}"),
            Self::TokenBucket { seconds } => format!("t{seconds}"),
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
