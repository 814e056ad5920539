//! Wire-level building blocks of the DTOs: the JSON Schemas of identifiers and time zones
//! (the schema twins of the `domain` parsers, so that the OpenAPI document states the same
//! rules the server enforces), and JSON Schema integers.
//!
//! Each schema is a named component, referenced wherever the value appears (bodies, query
//! and path parameters), so one rule is written once.

use serde::de::{self, Deserializer, Unexpected, Visitor};
use std::borrow::Cow;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// The pattern of printable text: no control characters U+0000-U+001F and U+007F-U+009F.
const PRINTABLE: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$";

/// A string schema of 1 to `max_length` characters matching `pattern`, the shape of every
/// identifier's schema.
fn text(max_length: usize, pattern: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(max_length))
        .pattern(Some(pattern))
}

/// Schema of policy ids and actions: 1-64 characters of `[a-z0-9._-]` (see `domain::ids`).
#[derive(Debug)]
pub(crate) struct Slug;

impl PartialSchema for Slug {
    fn schema() -> RefOr<Schema> {
        text(64, "^[a-z0-9._-]+$")
            .description(Some("1-64 characters of `[a-z0-9._-]`."))
            .examples(["transfer"])
            .into()
    }
}

impl ToSchema for Slug {}

/// Schema of an API key's action globs: an action's characters plus `*`, 1-64 of them,
/// in dot-separated segments none of which is empty (see `domain::globs`).
#[derive(Debug)]
pub(crate) struct GlobText;

impl PartialSchema for GlobText {
    fn schema() -> RefOr<Schema> {
        text(64, "^[a-z0-9_*-]+(\\.[a-z0-9_*-]+)*$")
            .description(Some(
                "An action glob: `*` matches any run of characters within one dot-separated segment.",
            ))
            .examples(["sms.*"])
            .into()
    }
}

impl ToSchema for GlobText {}

/// Schema of an API key's operations (see `access::Operation`).
#[derive(Debug)]
pub(crate) struct OperationName;

impl PartialSchema for OperationName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([
                "consume",
                "check",
                "usage",
                "refund",
                "holds",
                "ledger",
                "admin:read",
            ]))
            .into()
    }
}

impl ToSchema for OperationName {}

/// Schema of subjects: 1-256 bytes of printable UTF-8, that is without the control
/// characters U+0000-U+001F and U+007F-U+009F (see `domain::ids`).
///
/// JSON Schema counts characters, not bytes: `maxLength` is exact for ASCII, and a longer
/// UTF-8 encoding is answered 422 like any other rule the schema cannot state.
#[derive(Debug)]
pub(crate) struct SubjectText;

impl PartialSchema for SubjectText {
    fn schema() -> RefOr<Schema> {
        text(256, PRINTABLE)
            .description(Some(
                "1-256 bytes of printable UTF-8 (no control characters).",
            ))
            .examples(["user-42"])
            .into()
    }
}

impl ToSchema for SubjectText {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Subject")
    }
}

/// Schema of idempotency keys: 1-128 printable characters.
#[derive(Debug)]
pub struct IdempotencyKey;

impl PartialSchema for IdempotencyKey {
    fn schema() -> RefOr<Schema> {
        text(128, PRINTABLE)
            .description(Some("1-128 printable characters (no control characters)."))
            .into()
    }
}

impl ToSchema for IdempotencyKey {}

/// Schema of IANA time zone names: a string of the names' characters. Not an enum of the
/// ~600 names the server knows: generators turn enum values into identifiers, and names
/// such as `Etc/GMT+1` and `Etc/GMT-1` collide once they are; an unknown name is a 422.
#[derive(Debug)]
pub(crate) struct TimeZoneName;

impl PartialSchema for TimeZoneName {
    fn schema() -> RefOr<Schema> {
        text(64, "^[A-Za-z][A-Za-z0-9_+/-]*$")
            .description(Some(
                "An IANA time zone name, e.g. `America/New_York` (an unknown name is 422).",
            ))
            .examples(["America/New_York"])
            .into()
    }
}

impl ToSchema for TimeZoneName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("TimeZone")
    }
}

/// Schema of a request's attributes (see `domain::budget`): at most 16 keys of
/// `[a-z][a-z0-9_]{0,31}` (not `subject`), each a string of 1-128 printable characters.
#[derive(Debug)]
pub(crate) struct AttributesMap;

impl PartialSchema for AttributesMap {
    fn schema() -> RefOr<Schema> {
        let value = text(128, PRINTABLE);
        let name = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[a-z][a-z0-9_]{0,31}$"));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Attributes of the request, e.g. `{\"country\": \"NG\", \"plan\": \"free\"}`: \
                 at most 16 keys of `[a-z][a-z0-9_]{0,31}` (not `subject`), each a string of \
                 1-128 printable characters. A policy's `scope` and `match` name them.",
            ))
            .max_properties(Some(crate::domain::MAX_ATTRIBUTES))
            .property_names(Some(name))
            .additional_properties(Some(value))
            .examples([serde_json::json!({"country": "NG", "plan": "free"})])
            .into()
    }
}

impl ToSchema for AttributesMap {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Attributes")
    }
}

/// Reads a JSON Schema `integer`: any JSON number without a fractional part, so `3`, `3.0`
/// and `3e2` alike; `1.5` is an error naming the field (422).
///
/// Numbers written with a fraction or an exponent reach us as `f64`, parsed with correct
/// rounding (serde_json's `float_roundtrip` feature: its default fast path is off by one unit
/// for some 16-digit numbers), so integral values up to 2^53 - 1, the largest quantity,
/// convert exactly; a fraction finer than `f64` can hold (17 or more significant digits)
/// cannot be told from the integer it rounds to. Values beyond `i64` saturate, so that domain
/// parsing reports them as out of range.
struct WholeNumber;

impl Visitor<'_> for WholeNumber {
    type Value = i64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        Ok(i64::try_from(v).unwrap_or(i64::MAX))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
        if v.fract() != 0.0 || !v.is_finite() {
            return Err(E::invalid_value(Unexpected::Float(v), &self));
        }
        // `as` saturates at the bounds of i64, which are far outside every valid range.
        Ok(v as i64)
    }
}

/// `deserialize_with` for integer fields: see [`WholeNumber`].
pub(crate) fn whole_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(WholeNumber)
}

/// `deserialize_with` for optional integer fields (absent or `null` is `None`).
pub(crate) fn optional_whole_number<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    struct Optional;
    impl<'de> Visitor<'de> for Optional {
        type Value = Option<i64>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a whole number or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            whole_number(d).map(Some)
        }
    }
    deserializer.deserialize_option(Optional)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Body {
        #[serde(deserialize_with = "whole_number")]
        n: i64,
        #[serde(default, deserialize_with = "optional_whole_number")]
        m: Option<i64>,
    }

    fn n(json: &str) -> Result<i64, String> {
        serde_json::from_str::<Body>(json)
            .map(|b| b.n)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integers_are_whole_json_numbers_in_any_notation() {
        for (json, value) in [
            (r#"{"n": 3}"#, 3),
            (r#"{"n": -3}"#, -3),
            (r#"{"n": 3.0}"#, 3),
            (r#"{"n": 3e2}"#, 300),
            (r#"{"n": 9007199254740991.0}"#, 9_007_199_254_740_991),
            (r#"{"n": 18446744073709551615}"#, i64::MAX),
            (r#"{"n": 1e300}"#, i64::MAX),
        ] {
            assert_eq!(n(json), Ok(value), "{json}");
        }
        for json in [
            r#"{"n": 1.5}"#,
            r#"{"n": "3"}"#,
            r#"{"n": null}"#,
            r#"{"n": true}"#,
        ] {
            assert!(n(json).is_err(), "{json}");
        }
    }

    #[test]
    fn optional_integers_may_be_absent_or_null() {
        let m = |json: &str| serde_json::from_str::<Body>(json).map(|b| b.m).ok();
        assert_eq!(m(r#"{"n": 1}"#), Some(None));
        assert_eq!(m(r#"{"n": 1, "m": null}"#), Some(None));
        assert_eq!(m(r#"{"n": 1, "m": 2.0}"#), Some(Some(2)));
        assert_eq!(m(r#"{"n": 1, "m": 2.5}"#), None);
    }

    #[test]
    fn every_time_zone_in_the_schema_is_one_the_domain_accepts() {
        for tz in chrono_tz::TZ_VARIANTS {
            assert!(
                crate::domain::Window::calendar(crate::domain::CalendarPeriod::Day, tz.name())
                    .is_ok(),
                "{}",
                tz.name()
            );
        }
    }
}
