use super::*;
use chrono::{NaiveDate, Weekday};
use chrono_tz::America::{Havana, New_York, Santiago, St_Johns};
use chrono_tz::Asia::{Beirut, Kathmandu};
use chrono_tz::{Australia::Lord_Howe, Europe::Berlin, Pacific::Apia};
use proptest::prelude::*;

use CalendarPeriod::{Day, Hour, Minute, Month, Week, Year};

/// The plain calendar's bounds (no anchors), as most cases here want them, computed (the
/// cache of the latest period is tested on its own, below).
fn calendar_bounds(
    period: CalendarPeriod,
    tz: Tz,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    uncached_bounds(period, Anchors::default(), tz, now)
}

fn anchors(week_start: Weekday, day_start: u16, month_day: u8, year_month: u8) -> Anchors {
    Anchors {
        week_start,
        day_start,
        month_day,
        year_month,
    }
}

/// Each row: zone, period, anchors, `now`, the expected start and end, all in UTC.
type AnchoredCase = (
    Tz,
    CalendarPeriod,
    Anchors,
    &'static str,
    &'static str,
    &'static str,
);

#[test]
#[rustfmt::skip]
fn anchored_periods_start_at_their_cut_off_day_and_month() {
    use chrono_tz::Pacific::{Kiritimati, Pago_Pago};
    let plain = Anchors::default();
    let cut_off = anchors(Weekday::Mon, 4 * 60, 1, 1);
    let cases: [AnchoredCase; 16] = [
        // A bank's 04:00 cut-off in New York (UTC-5 in winter): 03:59 local is yesterday.
        (New_York, Day, cut_off, "2026-11-21 08:59", "2026-11-20 09:00", "2026-11-21 09:00"),
        (New_York, Day, cut_off, "2026-11-21 09:00", "2026-11-21 09:00", "2026-11-22 09:00"),
        // 02:30 is skipped on New York's spring-forward day: that day starts at 03:00 EDT.
        (New_York, Day, anchors(Weekday::Mon, 150, 1, 1), "2026-03-08 12:00", "2026-03-08 07:00", "2026-03-09 06:30"),
        // In Berlin a 04:00 cut-off day across the fall-back (25 h) and spring-forward (23 h).
        (Berlin, Day, cut_off, "2026-10-24 12:00", "2026-10-24 02:00", "2026-10-25 03:00"),
        (Berlin, Day, cut_off, "2026-03-28 12:00", "2026-03-28 03:00", "2026-03-29 02:00"),
        // Weeks from Sunday, in UTC and Kathmandu (+05:45).
        (Tz::UTC, Week, anchors(Weekday::Sun, 0, 1, 1), "2026-11-28 23:59", "2026-11-22 00:00", "2026-11-29 00:00"),
        (Kathmandu, Week, anchors(Weekday::Sun, 0, 1, 1), "2026-11-28 18:15", "2026-11-28 18:15", "2026-12-05 18:15"),
        // A cut-off moves the week's start too: Monday 04:00.
        (Tz::UTC, Week, cut_off, "2026-11-23 03:59", "2026-11-16 04:00", "2026-11-23 04:00"),
        // A billing month from the 15th; the 31st clamped to February's 28th and 29th.
        (Tz::UTC, Month, anchors(Weekday::Mon, 0, 15, 1), "2026-11-14 23:59", "2026-10-15 00:00", "2026-11-15 00:00"),
        (Tz::UTC, Month, anchors(Weekday::Mon, 0, 31, 1), "2026-02-28 00:00", "2026-02-28 00:00", "2026-03-31 00:00"),
        (Tz::UTC, Month, anchors(Weekday::Mon, 0, 31, 1), "2026-02-27 12:00", "2026-01-31 00:00", "2026-02-28 00:00"),
        (Tz::UTC, Month, anchors(Weekday::Mon, 0, 30, 1), "2028-02-29 12:00", "2028-02-29 00:00", "2028-03-30 00:00"),
        // Years across New Year at UTC+14 and UTC-11.
        (Kiritimati, Year, plain, "2026-12-31 09:59", "2025-12-31 10:00", "2026-12-31 10:00"),
        (Kiritimati, Year, plain, "2026-12-31 10:00", "2026-12-31 10:00", "2027-12-31 10:00"),
        (Pago_Pago, Year, plain, "2027-01-01 10:59", "2026-01-01 11:00", "2027-01-01 11:00"),
        // A fiscal year from April 6th (the UK's), with a 04:00 cut-off.
        (Tz::UTC, Year, anchors(Weekday::Mon, 240, 6, 4), "2027-04-06 03:59", "2026-04-06 04:00", "2027-04-06 04:00"),
    ];
    for (tz, period, anchors, now, start, end) in cases {
        let got = super::calendar_bounds(period, anchors, tz, utc(now));
        assert_eq!(got, (utc(start), utc(end)), "{period:?} {anchors:?} in {tz} at {now}");
    }
}

/// A UTC instant written `YYYY-MM-DD HH:MM` or `YYYY-MM-DD HH:MM:SS`.
fn utc(text: &str) -> DateTime<Utc> {
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M"))
        .expect("the test's instants are well-formed")
        .and_utc()
}

fn local(tz: Tz, instant: DateTime<Utc>) -> NaiveDateTime {
    instant.with_timezone(&tz).naive_local()
}

/// Each row: zone, period, `now`, the expected start and end, all in UTC.
type Case = (Tz, CalendarPeriod, &'static str, &'static str, &'static str);

fn check(cases: &[Case]) {
    for &(tz, period, now, start, end) in cases {
        let expected = (utc(start), utc(end));
        let got = calendar_bounds(period, tz, utc(now));
        assert_eq!(got, expected, "{period:?} in {tz} at {now}");
    }
}

#[test]
#[rustfmt::skip]
fn days_stretch_and_shrink_with_daylight_saving_but_not_in_kathmandu() {
    check(&[
        // New York 2026-03-08: 23 h; 2026-11-01: 25 h.
        (New_York, Day, "2026-03-08 12:00", "2026-03-08 05:00", "2026-03-09 04:00"),
        (New_York, Day, "2026-11-01 12:00", "2026-11-01 04:00", "2026-11-02 05:00"),
        // Berlin 2026-03-29: 23 h; 2026-10-25: 25 h.
        (Berlin, Day, "2026-03-29 12:00", "2026-03-28 23:00", "2026-03-29 22:00"),
        (Berlin, Day, "2026-10-25 12:00", "2026-10-24 22:00", "2026-10-25 23:00"),
        // Lord Howe moves its clocks by 30 minutes: 2026-04-05 has 24.5 h, 2026-10-04 23.5 h.
        (Lord_Howe, Day, "2026-04-05 01:00", "2026-04-04 13:00", "2026-04-05 13:30"),
        (Lord_Howe, Day, "2026-10-04 01:00", "2026-10-03 13:30", "2026-10-04 13:00"),
        // Kathmandu is +05:45 all year: its midnight is 18:15 UTC.
        (Kathmandu, Day, "2026-11-21 18:15", "2026-11-21 18:15", "2026-11-22 18:15"),
        (Kathmandu, Day, "2026-11-22 18:14:59", "2026-11-21 18:15", "2026-11-22 18:15"),
    ]);
}

#[test]
#[rustfmt::skip]
fn weeks_start_on_monday_and_months_roll_over_into_the_next_year() {
    check(&[
        // Saturday 2026-11-21 lies in the ISO week of Monday 2026-11-16.
        (Tz::UTC, Week, "2026-11-21 15:30", "2026-11-16 00:00", "2026-11-23 00:00"),
        (Tz::UTC, Month, "2028-02-29 23:59:59", "2028-02-01 00:00", "2028-03-01 00:00"),
        (Tz::UTC, Month, "2026-12-31 23:59:59", "2026-12-01 00:00", "2027-01-01 00:00"),
        (Berlin, Month, "2026-12-31 22:59:59", "2026-11-30 23:00", "2026-12-31 23:00"),
        (Berlin, Month, "2026-12-31 23:00", "2026-12-31 23:00", "2027-01-31 23:00"),
    ]);
    let (start, end) = calendar_bounds(Month, Tz::UTC, utc("2028-02-10 00:00"));
    assert_eq!((end - start).num_days(), 29, "2028 is a leap year");
}

#[test]
#[rustfmt::skip]
fn minutes_and_hours_in_kathmandu_fall_a_quarter_past_the_utc_hour() {
    check(&[
        // 10:37:42 UTC is 16:22:42 in Kathmandu.
        (Kathmandu, Minute, "2026-11-21 10:37:42", "2026-11-21 10:37", "2026-11-21 10:38"),
        (Kathmandu, Hour, "2026-11-21 10:37:42", "2026-11-21 10:15", "2026-11-21 11:15"),
        (Kathmandu, Hour, "2026-11-21 10:14:59", "2026-11-21 09:15", "2026-11-21 10:15"),
    ]);
}

#[test]
#[rustfmt::skip]
fn a_skipped_local_midnight_starts_the_day_at_the_transition() {
    check(&[
        // Havana springs from 00:00 (-05) to 01:00 (-04) at 2026-03-08 05:00 UTC...
        (Havana, Day, "2026-03-08 04:59:59", "2026-03-07 05:00", "2026-03-08 05:00"),
        (Havana, Day, "2026-03-08 05:00", "2026-03-08 05:00", "2026-03-09 04:00"),
        (Havana, Week, "2026-03-09 12:00", "2026-03-09 04:00", "2026-03-16 04:00"),
        // ...and turns 01:00 back to 00:00 at 2026-11-01 05:00 UTC: of the two local
        // midnights the earlier starts the 25-hour day.
        (Havana, Day, "2026-11-01 05:30", "2026-11-01 04:00", "2026-11-02 05:00"),
        // Santiago skips 2026-09-06 00:00 (-04 to -03) at 04:00 UTC.
        (Santiago, Day, "2026-09-06 03:59:59", "2026-09-05 04:00", "2026-09-06 04:00"),
        (Santiago, Day, "2026-09-06 12:00", "2026-09-06 04:00", "2026-09-07 03:00"),
        // Beirut skips 2026-03-29 00:00 (+02 to +03) at 2026-03-28 22:00 UTC.
        (Beirut, Day, "2026-03-29 12:00", "2026-03-28 22:00", "2026-03-29 21:00"),
        (Beirut, Month, "2026-03-29 12:00", "2026-02-28 22:00", "2026-03-31 21:00"),
    ]);
}

#[test]
#[rustfmt::skip]
fn apia_skipped_the_whole_of_2011_12_30() {
    // At 2011-12-30 10:00 UTC Samoa jumped from Thursday 29th 24:00 (-10) to Saturday 31st
    // 00:00 (+14): Friday 30th has no period at all, and its week has six days.
    check(&[
        (Apia, Day, "2011-12-30 09:59:59", "2011-12-29 10:00", "2011-12-30 10:00"),
        (Apia, Day, "2011-12-30 10:00", "2011-12-30 10:00", "2011-12-31 10:00"),
        (Apia, Hour, "2011-12-30 09:30", "2011-12-30 09:00", "2011-12-30 10:00"),
        (Apia, Minute, "2011-12-30 10:00:30", "2011-12-30 10:00", "2011-12-30 10:01"),
        (Apia, Week, "2011-12-30 12:00", "2011-12-26 10:00", "2012-01-01 10:00"),
        (Apia, Month, "2011-12-30 12:00", "2011-12-01 10:00", "2011-12-31 10:00"),
    ]);
}

#[test]
#[rustfmt::skip]
fn a_repeated_stretch_of_wall_clock_stays_in_the_period_already_running() {
    check(&[
        // New York repeats 01:00-02:00 on 2026-11-01: 05:00-06:00 UTC (EDT), 06:00-07:00 (EST).
        (New_York, Hour, "2026-11-01 06:30", "2026-11-01 05:00", "2026-11-01 07:00"),
        (New_York, Minute, "2026-11-01 05:30:10", "2026-11-01 05:30", "2026-11-01 05:31"),
        (New_York, Minute, "2026-11-01 06:00:30", "2026-11-01 05:59", "2026-11-01 07:00"),
        (New_York, Minute, "2026-11-01 07:00", "2026-11-01 07:00", "2026-11-01 07:01"),
        // ...and skips 02:00-03:00 on 2026-03-08: its 01:00 hour ends at the transition.
        (New_York, Hour, "2026-03-08 06:30", "2026-03-08 06:00", "2026-03-08 07:00"),
        // Lord Howe turns 02:00 (+11) back to 01:30 (+10:30) at 2026-04-04 15:00 UTC.
        (Lord_Howe, Hour, "2026-04-04 15:10", "2026-04-04 14:00", "2026-04-04 15:30"),
        (Lord_Howe, Minute, "2026-04-04 15:10", "2026-04-04 14:59", "2026-04-04 15:30"),
        // St. John's turned 2010-11-07 00:01 (-02:30) back to 2010-11-06 23:01 (-03:30) at
        // 02:31 UTC: 03:00 UTC reads 23:30 on the 6th, yet the 7th has already begun.
        (St_Johns, Day, "2010-11-07 03:00", "2010-11-07 02:30", "2010-11-08 03:30"),
        (St_Johns, Day, "2010-11-07 02:29:59", "2010-11-06 02:30", "2010-11-07 02:30"),
    ]);
}

#[test]
fn periods_tile_time_across_transitions() {
    let transitions = [
        (New_York, "2026-11-01 06:00"),
        (New_York, "2026-03-08 07:00"),
        (Lord_Howe, "2026-04-04 15:00"),
        (St_Johns, "2010-11-07 02:31"),
        (Apia, "2011-12-30 10:00"),
    ];
    for (tz, at) in transitions {
        for period in [Minute, Hour, Day] {
            let from = utc(at) - TimeDelta::hours(3);
            let (mut start, mut end) = calendar_bounds(period, tz, from);
            let mut now = from;
            while now < utc(at) + TimeDelta::hours(3) {
                while now >= end {
                    (start, end) = (end, calendar_bounds(period, tz, end).1);
                }
                assert_eq!(
                    calendar_bounds(period, tz, now),
                    (start, end),
                    "{period:?} in {tz} at {now}"
                );
                now += TimeDelta::seconds(20);
            }
        }
    }
}

#[test]
fn the_limits_of_chrono_give_an_answer_without_panicking() {
    for period in [Minute, Hour, Day, Week, Month, Year] {
        for tz in [Tz::UTC, Apia, Kathmandu] {
            for now in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
                let (start, end) = calendar_bounds(period, tz, now);
                assert!(start <= now && now <= end, "{period:?} in {tz} at {now}");
            }
        }
    }
}

fn any_period() -> impl Strategy<Value = CalendarPeriod> {
    prop::sample::select(vec![Minute, Hour, Day, Week, Month, Year])
}

/// Anchors for `period`: only those it uses (a minute or an hour has none).
fn any_anchors(period: CalendarPeriod) -> impl Strategy<Value = Anchors> {
    let weekdays = prop::sample::select(vec![
        Weekday::Mon,
        Weekday::Tue,
        Weekday::Wed,
        Weekday::Thu,
        Weekday::Fri,
        Weekday::Sat,
        Weekday::Sun,
    ]);
    (weekdays, 0_u16..1_440, 1_u8..=31, 1_u8..=12).prop_map(move |(week, day, month_day, month)| {
        match period {
            Minute | Hour => Anchors::default(),
            Day => anchors(Weekday::Mon, day, 1, 1),
            Week => anchors(week, day, 1, 1),
            Month => anchors(Weekday::Mon, day, month_day, 1),
            Year => anchors(Weekday::Mon, day, month_day, month),
        }
    })
}

fn any_zone() -> impl Strategy<Value = Tz> {
    prop::sample::select(vec![Tz::UTC, New_York, Berlin, Lord_Howe, Kathmandu])
}

/// Instants from 2000-01-01 to 2040-01-01 with nanoseconds, half of them in March, April,
/// October or November, the months in which these zones change their clocks.
fn any_instant() -> impl Strategy<Value = DateTime<Utc>> {
    let anytime = 946_684_800_i64..2_208_988_800;
    let months = prop::sample::select(vec![3_u32, 4, 10, 11]);
    let clock_changes = (2000_i32..2040, months, 1_u32..=30, 0_i64..86_400).prop_map(
        |(year, month, day, second)| {
            let date = NaiveDate::from_ymd_opt(year, month, day).expect("a valid date");
            date.and_time(NaiveTime::MIN).and_utc().timestamp() + second
        },
    );
    (prop_oneof![anytime, clock_changes], 0_u32..1_000_000_000)
        .prop_map(|(secs, nanos)| DateTime::from_timestamp(secs, nanos).expect("in chrono's range"))
}

fn day_minutes(tz: Tz, now: DateTime<Utc>) -> i64 {
    let (start, end) = calendar_bounds(Day, tz, now);
    (end - start).num_minutes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_024))]

    #[test]
    fn the_latest_period_a_thread_keeps_is_the_one_computed(
        tz in any_zone(),
        (period, anchors) in any_period().prop_flat_map(|p| (Just(p), any_anchors(p))),
        now in any_instant(),
        later in 0.0..1.0f64,
        other in any_zone(),
    ) {
        let bounds = |at| super::calendar_bounds(period, anchors, tz, at);
        let computed = |at| uncached_bounds(period, anchors, tz, at);
        let (start, end) = bounds(now);
        prop_assert_eq!((start, end), computed(now));
        // A later instant of the same period, one of the next period, one before: each as
        // computed, whatever the thread kept.
        let span = (end - start).num_milliseconds() as f64;
        let inside = start + TimeDelta::milliseconds((span * later) as i64);
        for at in [inside, end, end + TimeDelta::milliseconds(1), start - TimeDelta::milliseconds(1), now] {
            prop_assert_eq!(bounds(at), computed(at), "{}", at);
        }
        // Another zone's period in between: the same policy's is computed again.
        let theirs = super::calendar_bounds(period, anchors, other, now);
        prop_assert_eq!(theirs, uncached_bounds(period, anchors, other, now));
        prop_assert_eq!(bounds(now), computed(now));
    }

    #[test]
    fn every_instant_lies_in_a_period_that_tiles_time(
        tz in any_zone(), period in any_period(), now in any_instant(),
    ) {
        let (start, end) = calendar_bounds(period, tz, now);
        prop_assert!(start <= now && now < end, "{:?}", (start, end));
        prop_assert_eq!(calendar_bounds(period, tz, start), (start, end));
        prop_assert_eq!(calendar_bounds(period, tz, end).0, end);
        let just_before = start - TimeDelta::nanoseconds(1);
        prop_assert_eq!(calendar_bounds(period, tz, just_before).1, start);
    }

    #[test]
    fn every_anchored_period_tiles_time_and_starts_at_its_anchor(
        tz in any_zone(),
        (period, anchors) in any_period().prop_flat_map(|p| (Just(p), any_anchors(p))),
        now in any_instant(),
    ) {
        let bounds = |at| uncached_bounds(period, anchors, tz, at);
        let (start, end) = bounds(now);
        prop_assert!(start <= now && now < end, "{:?}", (start, end));
        prop_assert_eq!(bounds(start), (start, end));
        prop_assert_eq!(bounds(end).0, end);
        prop_assert_eq!(bounds(start - TimeDelta::nanoseconds(1)).1, start);
        // The start is the anchor's local time, unless a transition skipped it.
        if !matches!(period, Minute | Hour) {
            let local = local(tz, start);
            let anchor = local.date().and_time(NaiveTime::MIN)
                + TimeDelta::minutes(i64::from(anchors.day_start));
            let skipped = tz.from_local_datetime(&anchor).single().is_none();
            prop_assert!(
                skipped || u32::from(anchors.day_start) == local.hour() * 60 + local.minute(),
                "{local} does not start at minute {}", anchors.day_start
            );
        }
    }

    #[test]
    fn day_periods_in_new_york_are_23_24_or_25_hours(now in any_instant()) {
        prop_assert!([23 * 60, 24 * 60, 25 * 60].contains(&day_minutes(New_York, now)));
    }

    #[test]
    fn day_periods_in_berlin_are_23_24_or_25_hours(now in any_instant()) {
        prop_assert!([23 * 60, 24 * 60, 25 * 60].contains(&day_minutes(Berlin, now)));
    }

    #[test]
    fn day_periods_on_lord_howe_are_23_and_a_half_24_or_24_and_a_half_hours(
        now in any_instant(),
    ) {
        let minutes = day_minutes(Lord_Howe, now);
        prop_assert!([23 * 60 + 30, 24 * 60, 24 * 60 + 30].contains(&minutes));
    }

    #[test]
    fn day_periods_in_kathmandu_and_utc_are_exactly_24_hours(now in any_instant()) {
        prop_assert_eq!(day_minutes(Kathmandu, now), 24 * 60);
        prop_assert_eq!(day_minutes(Tz::UTC, now), 24 * 60);
    }

    #[test]
    fn weeks_start_on_monday_at_local_midnight(tz in any_zone(), now in any_instant()) {
        let (start, end) = calendar_bounds(Week, tz, now);
        for boundary in [start, end] {
            let wall = local(tz, boundary);
            prop_assert_eq!(wall.weekday(), Weekday::Mon);
            prop_assert_eq!(wall.time(), NaiveTime::MIN);
        }
    }

    #[test]
    fn months_start_on_the_first_at_local_midnight(tz in any_zone(), now in any_instant()) {
        let (start, end) = calendar_bounds(Month, tz, now);
        for boundary in [start, end] {
            let wall = local(tz, boundary);
            prop_assert_eq!((wall.day(), wall.time()), (1, NaiveTime::MIN));
        }
        let days = local(tz, end).date() - local(tz, start).date();
        prop_assert!((28..=31).contains(&days.num_days()));
    }

    #[test]
    fn hours_in_kathmandu_start_a_quarter_past_the_utc_hour(now in any_instant()) {
        let (start, end) = calendar_bounds(Hour, Kathmandu, now);
        prop_assert_eq!((start.minute(), start.second(), start.nanosecond()), (15, 0, 0));
        prop_assert_eq!(end - start, TimeDelta::hours(1));
    }
}
