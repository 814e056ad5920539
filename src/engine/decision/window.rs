//! Calendar period boundaries in IANA time zones: pure functions of `now`.
//!
//! A calendar period lives on the wall clock of the policy's zone: a minute (seconds zeroed),
//! an hour (minutes zeroed), a day (local midnight), an ISO week (local midnight of its Monday)
//! or a month (local midnight of the 1st). Every boundary is a local time, mapped to a single
//! UTC instant: the first instant at which the zone's wall clock reaches it. That mapping
//! never goes backwards, so the boundaries cut the UTC time line into contiguous,
//! non-overlapping periods, and `now` belongs to the last period that has started by then.
//!
//! Daylight-saving transitions bend this in three ways:
//! - A boundary that a spring-forward gap skips (local midnight in America/Havana, Asia/Beirut
//!   or America/Santiago) starts its period at the transition, the first instant after the
//!   gap. A period whose whole span is skipped (Pacific/Apia's 2011-12-30) is empty and is
//!   never returned.
//! - A boundary that a fall-back overlap repeats maps to its earliest instant: the repeated
//!   stretch of wall-clock time stays in the period already running instead of resetting
//!   usage a second time, so New York's 01:00 hour lasts two hours on its fall-back day.
//! - While the clock repeats that stretch it shows times that have already passed; they belong
//!   to the period the clock had reached before it was turned back, so New York's 01:59 minute
//!   lasts 61 minutes once a year, and a zone that turned back across midnight (America/St_Johns
//!   until 2010: 00:01 back to 23:01) does not return to the previous day.

use chrono::{
    DateTime, Datelike, Days, LocalResult, Months, NaiveDate, NaiveDateTime, NaiveTime, Offset,
    TimeDelta, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use std::cell::Cell;

use crate::domain::{Anchors, CalendarPeriod};

/// How far from a skipped local time (read as if it were UTC) its gap's transition can be.
///
/// UTC offsets in the tz database stay within ±16 hours, so the transition lies within 16
/// hours of that reading; two more hours are margin. Gaps are at most 24 hours long
/// (Pacific/Apia 2011, Pacific/Kwajalein 1993) and transitions are days apart, so no other
/// transition falls inside the 36-hour search range.
const GAP_SEARCH_SECONDS: i64 = 18 * 3_600;

/// The calendar period of `period` in `tz` that contains `now`, as UTC instants [start, end).
///
/// Always `start <= now < end`; `calendar_bounds(period, tz, start)` is `(start, end)` and
/// `calendar_bounds(period, tz, end)` starts at `end`, so consecutive periods tile time. See the
/// module documentation for local times that a transition skips or repeats.
pub fn calendar_bounds(
    period: CalendarPeriod,
    anchors: Anchors,
    tz: Tz,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let key = (period, anchors, tz);
    if let Some(bounds) = LATEST.with(|latest| latest.get().filter(|l| l.0 == key)) {
        let (_, start, end) = bounds;
        if start <= now && now < end {
            return (start, end);
        }
    }
    let bounds = computed_bounds(Anchored { period, anchors }, tz, now);
    LATEST.with(|latest| latest.set(Some((key, bounds.0, bounds.1))));
    bounds
}

/// The calendar period a thread computed last, and its bounds: the periods of one
/// calendar tile time, so a later instant inside them lies in the same period, and a
/// policy's decisions of one day skip the zone's arithmetic.
type Latest = ((CalendarPeriod, Anchors, Tz), DateTime<Utc>, DateTime<Utc>);

thread_local! {
    static LATEST: Cell<Option<Latest>> = const { Cell::new(None) };
}

/// [`calendar_bounds`] without the thread's latest period (for the tests of the arithmetic).
#[cfg(test)]
fn uncached_bounds(
    period: CalendarPeriod,
    anchors: Anchors,
    tz: Tz,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    computed_bounds(Anchored { period, anchors }, tz, now)
}

/// [`calendar_bounds`], computed.
fn computed_bounds(period: Anchored, tz: Tz, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    // `zoned_bounds` gives up only within a period of chrono's date limits (±262,000 years), or
    // on zone data with two transitions less than a day apart, which the tz database does not
    // have (in chrono-tz's data they are about a week apart at the closest). UTC periods are
    // then an answer that cannot panic and contains `now` anywhere but at chrono's very end.
    zoned_bounds(period, tz, now).unwrap_or_else(|| utc_bounds(period, now))
}

/// [`calendar_bounds`] on the zone's wall clock; `None` if the search fails (see there).
fn zoned_bounds(
    period: Anchored,
    tz: Tz,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let offset = offset_seconds(tz, now.timestamp())?;
    let wall = now
        .naive_utc()
        .checked_add_signed(TimeDelta::try_seconds(i64::from(offset))?)?;
    let (start, end) = period_from(period, tz, wall)?;
    if now < end {
        // The common case: `now` lies in the period that its own wall-clock time names. Its
        // start is never later than `now`, because the clock reached `wall` by `now`.
        return (start <= now).then_some((start, end));
    }
    // The clock has already reached `end` once but now shows an earlier time: a fall-back
    // transition between `end` and `now` turned it back, and `now` belongs to the period the
    // clock had reached just before that. Find the transition: the first second after `end`
    // with `now`'s offset (until then the zone kept its larger, pre-transition offset). The
    // search spans at most twice the size of the turn-back, so it takes about 17 steps.
    let turned_back = first_true(end.timestamp(), now.timestamp(), |t| {
        offset_seconds(tz, t) == Some(offset)
    });
    let last_second = DateTime::from_timestamp(turned_back.checked_sub(1)?, 0)?;
    let (start, end) = period_from(period, tz, wall_clock(tz, last_second)?)?;
    (start <= now && now < end).then_some((start, end))
}

/// The UTC bounds of the period whose wall-clock span contains the local time `wall`.
fn period_from(
    period: Anchored,
    tz: Tz,
    wall: NaiveDateTime,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let first = truncate(period, wall)?;
    let next = advance(period, first)?;
    Some((boundary_instant(tz, first)?, boundary_instant(tz, next)?))
}

/// The first instant at which `tz`'s wall clock reaches the local time `boundary`.
fn boundary_instant(tz: Tz, boundary: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&boundary) {
        LocalResult::Single(instant) => Some(instant.with_timezone(&Utc)),
        // A fall-back transition repeats `boundary`: take its earliest instant, so that the
        // repeated stretch stays in the period already running (usage is not reset twice).
        // chrono-tz lists the earlier instant first; `min` does not rely on it.
        LocalResult::Ambiguous(a, b) => Some(a.min(b).with_timezone(&Utc)),
        // A spring-forward transition skips `boundary`: the period starts at the transition,
        // the first instant whose wall-clock time is past the boundary.
        LocalResult::None => gap_end(tz, boundary),
    }
}

/// The transition instant of the spring-forward gap that skips the local time `skipped`.
///
/// It is the first instant whose wall-clock time is at least `skipped`. Wall-clock time only
/// increases within [`GAP_SEARCH_SECONDS`] of the gap, so a binary search over whole seconds
/// (about 17 steps, as all transitions fall on whole seconds) finds it even for Apia's
/// 24-hour gap.
fn gap_end(tz: Tz, skipped: NaiveDateTime) -> Option<DateTime<Utc>> {
    let target = skipped.and_utc().timestamp();
    let reached = |t: i64| {
        offset_seconds(tz, t)
            .and_then(|offset| t.checked_add(i64::from(offset)))
            .is_none_or(|wall| wall >= target)
    };
    let lo = target.checked_sub(GAP_SEARCH_SECONDS)?;
    let hi = target.checked_add(GAP_SEARCH_SECONDS)?;
    if reached(lo) || !reached(hi) {
        return None;
    }
    DateTime::from_timestamp(first_true(lo, hi, reached), 0)
}

/// The first second in `(lo, hi]` at which `pred` holds, for `pred` false at `lo`, true at
/// `hi` and switching once in between; at most 64 halvings of the range.
fn first_true(mut lo: i64, mut hi: i64, pred: impl Fn(i64) -> bool) -> i64 {
    while hi.saturating_sub(lo) > 1 {
        // The floor of the mean, without overflow even for a range wider than `i64`'s half.
        let mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1);
        if pred(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// `tz`'s UTC offset in seconds at the Unix time `t`; `None` outside chrono's range.
fn offset_seconds(tz: Tz, t: i64) -> Option<i32> {
    let instant = DateTime::from_timestamp(t, 0)?;
    Some(
        tz.offset_from_utc_datetime(&instant.naive_utc())
            .fix()
            .local_minus_utc(),
    )
}

/// `tz`'s wall-clock time at `instant`; `None` outside chrono's range.
fn wall_clock(tz: Tz, instant: DateTime<Utc>) -> Option<NaiveDateTime> {
    let offset = tz
        .offset_from_utc_datetime(&instant.naive_utc())
        .fix()
        .local_minus_utc();
    instant
        .naive_utc()
        .checked_add_signed(TimeDelta::try_seconds(i64::from(offset))?)
}

/// A calendar period and where each one starts.
#[derive(Debug, Clone, Copy)]
struct Anchored {
    period: CalendarPeriod,
    anchors: Anchors,
}

/// The first local time of the period containing the local time `wall`.
///
/// A day that starts at `day_start` is the plain day of the wall clock moved back by
/// `day_start`: the period is found on that shifted clock, and its first day starts at
/// `day_start` again.
fn truncate(period: Anchored, wall: NaiveDateTime) -> Option<NaiveDateTime> {
    let Anchored { period, anchors } = period;
    let date = wall.date();
    match period {
        CalendarPeriod::Minute => date.and_hms_opt(wall.hour(), wall.minute(), 0),
        CalendarPeriod::Hour => date.and_hms_opt(wall.hour(), 0, 0),
        CalendarPeriod::Day
        | CalendarPeriod::Week
        | CalendarPeriod::Month
        | CalendarPeriod::Year => {
            let shift = TimeDelta::try_minutes(i64::from(anchors.day_start))?;
            let date = wall.checked_sub_signed(shift)?.date();
            let first = match period {
                CalendarPeriod::Week => {
                    let since = (date.weekday().num_days_from_monday() + 7
                        - anchors.week_start.num_days_from_monday())
                        % 7;
                    date.checked_sub_days(Days::new(u64::from(since)))?
                }
                CalendarPeriod::Month => {
                    let this = anchor_date(date.year(), date.month(), anchors.month_day)?;
                    match date >= this {
                        true => this,
                        false => {
                            let before = date.with_day(1)?.checked_sub_months(Months::new(1))?;
                            anchor_date(before.year(), before.month(), anchors.month_day)?
                        }
                    }
                }
                CalendarPeriod::Year => {
                    let month = u32::from(anchors.year_month);
                    let this = anchor_date(date.year(), month, anchors.month_day)?;
                    match date >= this {
                        true => this,
                        false => {
                            anchor_date(date.year().checked_sub(1)?, month, anchors.month_day)?
                        }
                    }
                }
                _ => date,
            };
            first.and_time(NaiveTime::MIN).checked_add_signed(shift)
        }
    }
}

/// The first local time of the period after the one starting at the local time `first`.
fn advance(period: Anchored, first: NaiveDateTime) -> Option<NaiveDateTime> {
    let Anchored { period, anchors } = period;
    let shift = TimeDelta::try_minutes(i64::from(anchors.day_start))?;
    let date = first.checked_sub_signed(shift)?.date();
    let next = match period {
        CalendarPeriod::Minute => return first.checked_add_signed(TimeDelta::try_minutes(1)?),
        CalendarPeriod::Hour => return first.checked_add_signed(TimeDelta::try_hours(1)?),
        CalendarPeriod::Day => date.checked_add_days(Days::new(1))?,
        CalendarPeriod::Week => date.checked_add_days(Days::new(7))?,
        // `date` is in the month its period is anchored to (clamped within it): the next
        // period starts in the month after, clamped again (the 31st: Jan 31, Feb 28, Mar 31).
        CalendarPeriod::Month => {
            let after = date.with_day(1)?.checked_add_months(Months::new(1))?;
            anchor_date(after.year(), after.month(), anchors.month_day)?
        }
        CalendarPeriod::Year => anchor_date(
            date.year().checked_add(1)?,
            u32::from(anchors.year_month),
            anchors.month_day,
        )?,
    };
    next.and_time(NaiveTime::MIN).checked_add_signed(shift)
}

/// Day `day` of `month` in `year`, or the month's last day when it is shorter.
fn anchor_date(year: i32, month: u32, day: u8) -> Option<NaiveDate> {
    let first = NaiveDate::from_ymd_opt(year, month, 1)?;
    let last = first
        .checked_add_months(Months::new(1))
        .and_then(|next| next.pred_opt())
        .map_or(31, |last| last.day());
    first.with_day(u32::from(day).min(last))
}

/// The period containing `now` on the UTC clock: the fallback of [`calendar_bounds`].
///
/// At chrono's limits a missing bound becomes `now` (start) or the last representable
/// instant (end) rather than a panic.
fn utc_bounds(period: Anchored, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let first = truncate(period, now.naive_utc());
    let start = first.map_or(now, |first| first.and_utc());
    let end = first
        .and_then(|first| advance(period, first))
        .map_or(DateTime::<Utc>::MAX_UTC, |next| next.and_utc());
    (start, end)
}

#[cfg(test)]
mod tests;
