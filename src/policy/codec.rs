//! Turning stored columns back into domain values (and windows into their stored JSON).

use super::PolicyStoreError;
use crate::domain::{Anchors, AnchorsInput, CalendarPeriod, Match, Scope, Window};
use serde_json::{json, Value};

/// The stored JSON form of a window (the same shape as on the wire), with a calendar
/// window's `timezone_attribute`, if any.
pub(crate) fn window_to_json(window: &Window, zone_attribute: Option<&str>) -> String {
    let value = match window {
        Window::Calendar {
            period,
            timezone,
            anchors,
        } => {
            let mut value =
                json!({"type": "calendar", "period": period.as_str(), "timezone": timezone.name()});
            if let Some(attribute) = zone_attribute {
                value["timezone_attribute"] = json!(attribute);
            }
            // Only the anchors that differ from the plain calendar, so that a plain window
            // is stored as it always was (and read by every release).
            let plain = Anchors::default();
            if anchors.week_start != plain.week_start {
                value["week_start"] = json!(anchors.week_start_name());
            }
            if anchors.day_start != plain.day_start {
                value["day_start"] = json!(anchors.day_start_text());
            }
            if anchors.month_day != plain.month_day {
                value["month_day"] = json!(anchors.month_day);
            }
            if anchors.year_month != plain.year_month {
                value["year_month"] = json!(anchors.year_month);
            }
            value
        }
        Window::Rolling {
            seconds,
            bucket_seconds,
        } => json!({"type": "rolling", "seconds": seconds, "bucket_seconds": bucket_seconds}),
        Window::TokenBucket { seconds } => json!({"type": "token_bucket", "seconds": seconds}),
        Window::Request => json!({"type": "request"}),
        Window::Lifetime => json!({"type": "lifetime"}),
    };
    value.to_string()
}

/// Parses a stored window, and its `timezone_attribute` if any.
pub(crate) fn window_from_json(text: &str) -> Result<(Window, Option<String>), PolicyStoreError> {
    let corrupt = |why: &str| PolicyStoreError::Corrupt(format!("window {text}: {why}"));
    let value: Value = serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
    let int = |name: &str| -> i128 { value[name].as_i64().map_or(-1, i128::from) };
    let window = match value["type"].as_str() {
        Some("calendar") => {
            let period = CalendarPeriod::parse("period", value["period"].as_str().unwrap_or(""));
            period.and_then(|p| {
                let anchors = Anchors::parse(
                    p,
                    &AnchorsInput {
                        week_start: value["week_start"].as_str(),
                        day_start: value["day_start"].as_str(),
                        month_day: value["month_day"].as_i64(),
                        year_month: value["year_month"].as_i64(),
                    },
                )?;
                Window::calendar(p, value["timezone"].as_str().unwrap_or(""))
                    .map(|window| window.anchored(anchors))
            })
        }
        Some("rolling") => Window::rolling(int("seconds"), int("bucket_seconds")),
        Some("token_bucket") => Window::token_bucket(int("seconds")),
        Some("request") => Ok(Window::Request),
        Some("lifetime") => Ok(Window::Lifetime),
        _ => return Err(corrupt("unknown type")),
    };
    let zone_attribute = value["timezone_attribute"].as_str().map(str::to_owned);
    window
        .map(|window| (window, zone_attribute))
        .map_err(|e| corrupt(&e.message))
}

/// The stored form of a scope: its key names joined by `,`; `None` (NULL) for the default.
pub(crate) fn scope_to_column(scope: &Scope) -> Option<String> {
    (!scope.is_default()).then(|| scope.names())
}

/// Parses a stored scope.
pub(crate) fn scope_from_column(text: Option<&str>) -> Result<Scope, PolicyStoreError> {
    match text {
        None => Ok(Scope::default()),
        Some(names) => Scope::from_names(names)
            .map_err(|e| PolicyStoreError::Corrupt(format!("scope '{names}': {e}"))),
    }
}

/// The stored form of a `match`: a JSON object of arrays; `None` (NULL) when empty.
pub(crate) fn match_to_column(conditions: &Match) -> Option<String> {
    let map: serde_json::Map<String, Value> = conditions
        .iter()
        .map(|(key, values)| (key.to_owned(), json!(values)))
        .collect();
    (!map.is_empty()).then(|| Value::Object(map).to_string())
}

/// Parses a stored `match`.
pub(crate) fn match_from_column(text: Option<&str>) -> Result<Match, PolicyStoreError> {
    let Some(text) = text else {
        return Ok(Match::default());
    };
    let corrupt = |why: String| PolicyStoreError::Corrupt(format!("match {text}: {why}"));
    let map: std::collections::BTreeMap<String, Vec<String>> =
        serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    Match::parse("match", map).map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_type_survives_a_round_trip() {
        let sunday_cut_off = Anchors {
            week_start: chrono::Weekday::Sun,
            day_start: 240,
            ..Anchors::default()
        };
        let fiscal = Anchors {
            day_start: 1,
            month_day: 6,
            year_month: 4,
            ..Anchors::default()
        };
        let windows = [
            Window::calendar(CalendarPeriod::Week, "Asia/Kathmandu").expect("valid"),
            Window::calendar(CalendarPeriod::Week, "Asia/Kathmandu")
                .expect("valid")
                .anchored(sunday_cut_off),
            Window::calendar(CalendarPeriod::Year, "Europe/London")
                .expect("valid")
                .anchored(fiscal),
            Window::rolling(86_400, 3_600).expect("valid"),
            Window::token_bucket(60).expect("valid"),
            Window::Request,
            Window::Lifetime,
        ];
        for window in windows {
            let text = window_to_json(&window, None);
            assert_eq!(window_from_json(&text).ok(), Some((window, None)), "{text}");
        }
        let day = Window::calendar(CalendarPeriod::Day, "UTC").expect("valid");
        let text = window_to_json(&day, Some("tz"));
        assert!(
            !text.contains("day_start"),
            "a plain window is stored as before: {text}"
        );
        assert_eq!(
            window_from_json(&text).ok(),
            Some((day, Some("tz".to_owned())))
        );
        assert!(window_from_json("{\"type\":\"sundial\"}").is_err());
    }

    #[test]
    fn scopes_and_matches_survive_a_round_trip_and_defaults_are_null() {
        assert_eq!(scope_to_column(&Scope::default()), None);
        for keys in [&["org", "subject"][..], &[][..], &["country"][..]] {
            let scope = Scope::parse("scope", keys).expect("valid");
            let column = scope_to_column(&scope);
            assert!(column.is_some(), "{keys:?}");
            assert_eq!(scope_from_column(column.as_deref()).ok(), Some(scope));
        }
        assert_eq!(match_to_column(&Match::default()), None);
        let conditions = Match::parse(
            "match",
            [(
                "plan".to_owned(),
                vec!["free".to_owned(), "trial".to_owned()],
            )],
        )
        .expect("valid");
        let column = match_to_column(&conditions);
        assert_eq!(column.as_deref(), Some(r#"{"plan":["free","trial"]}"#));
        assert_eq!(match_from_column(column.as_deref()).ok(), Some(conditions));
        assert!(match_from_column(Some("[1]")).is_err());
    }
}
