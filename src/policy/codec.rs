//! Turning stored columns back into domain values (and windows into their stored JSON).

use super::PolicyStoreError;
use crate::domain::{CalendarPeriod, Window};
use serde_json::{json, Value};

/// The stored JSON form of a window (the same shape as on the wire).
pub(crate) fn window_to_json(window: &Window) -> String {
    let value = match window {
        Window::Calendar { period, timezone } => {
            json!({"type": "calendar", "period": period.as_str(), "timezone": timezone.name()})
        }
        Window::Rolling {
            seconds,
            bucket_seconds,
        } => json!({"type": "rolling", "seconds": seconds, "bucket_seconds": bucket_seconds}),
        Window::TokenBucket { seconds } => json!({"type": "token_bucket", "seconds": seconds}),
    };
    value.to_string()
}

/// Parses a stored window.
pub(crate) fn window_from_json(text: &str) -> Result<Window, PolicyStoreError> {
    let corrupt = |why: &str| PolicyStoreError::Corrupt(format!("window {text}: {why}"));
    let value: Value = serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
    let int = |name: &str| -> i128 { value[name].as_i64().map_or(-1, i128::from) };
    let window = match value["type"].as_str() {
        Some("calendar") => {
            let period = CalendarPeriod::parse("period", value["period"].as_str().unwrap_or(""));
            period.and_then(|p| Window::calendar(p, value["timezone"].as_str().unwrap_or("")))
        }
        Some("rolling") => Window::rolling(int("seconds"), int("bucket_seconds")),
        Some("token_bucket") => Window::token_bucket(int("seconds")),
        _ => return Err(corrupt("unknown type")),
    };
    window.map_err(|e| corrupt(&e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_type_survives_a_round_trip() {
        let windows = [
            Window::calendar(CalendarPeriod::Week, "Asia/Kathmandu").expect("valid"),
            Window::rolling(86_400, 3_600).expect("valid"),
            Window::token_bucket(60).expect("valid"),
        ];
        for window in windows {
            let text = window_to_json(&window);
            assert_eq!(window_from_json(&text).expect("parses"), window, "{text}");
        }
        assert!(window_from_json("{\"type\":\"sundial\"}").is_err());
    }
}
