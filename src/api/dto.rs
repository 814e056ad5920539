//! Wire shapes of the admin API (`ToSchema` is derived only in `api`: here, beside each
//! handler, and in `wire.rs`).

use super::wire::{whole_number, Slug, TimeZoneName};
use crate::domain::{
    Action, Anchors, AnchorsInput, CalendarPeriod, FieldErrors, Match, Measure, Mode, Override,
    OverrideSpec, Policy, PolicyId, PolicySpec, Quantity, Scope, ScopeKey, Window,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

mod convert;

/// A policy's time window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum WindowDto {
    /// Usage resets at each period boundary in `timezone`.
    Calendar {
        /// minute, hour, day, week (from Monday unless `week_start`), month or year.
        #[schema(example = "day")]
        period: PeriodDto,
        /// IANA time zone name; default `UTC`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<TimeZoneName>, example = "America/New_York")]
        timezone: Option<String>,
        /// An attribute key (e.g. `tz`): a request carrying it counts in the IANA zone it
        /// names (an unknown name is 422), else in `timezone`. A period, once started, runs
        /// to its end in the zone it started in; another zone applies from the next period.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(example = "tz", pattern = "^[a-z][a-z0-9_]{0,31}$")]
        timezone_attribute: Option<String>,
        /// `week` periods: the day a week starts on; default `monday`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<WeekdayDto>, example = "sunday")]
        week_start: Option<String>,
        /// `day`, `week`, `month` and `year` periods: the local time `HH:MM` at which a
        /// day (and so a week, month or year) starts, e.g. a bank's `04:00` cut-off; default
        /// `00:00`. On a day that skips it (daylight saving), the day starts at the jump.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(example = "04:00", pattern = "^([01][0-9]|2[0-3]):[0-5][0-9]$")]
        day_start: Option<String>,
        /// `month` and `year` periods: the day of the month a period starts on, clamped to
        /// a shorter month's last day (31: Jan 31, Feb 28, Mar 31); default 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(minimum = 1, maximum = 31, example = 15)]
        month_day: Option<i64>,
        /// `year` periods: the month a year starts in; default 1 (January).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(minimum = 1, maximum = 12, example = 4)]
        year_month: Option<i64>,
    },
    /// Total in any trailing `seconds` never exceeds the limit; counted in buckets.
    Rolling {
        /// Window length W in seconds, at most 366 days.
        #[serde(deserialize_with = "whole_number")]
        #[schema(example = 86400, minimum = 1, maximum = 31622400)]
        seconds: i64,
        /// Bucket length B in seconds; divides W; at most 1,440 buckets.
        #[serde(deserialize_with = "whole_number")]
        #[schema(example = 3600, minimum = 1, maximum = 31622400)]
        bucket_seconds: i64,
    },
    /// `limit` units per `seconds`, refilled smoothly (GCRA); bursts up to `limit`.
    TokenBucket {
        /// Refill period in seconds, at most 366 days; `limit × seconds × 1000` must stay
        /// below 2^53.
        #[serde(deserialize_with = "whole_number")]
        #[schema(example = 3600, minimum = 1, maximum = 31622400)]
        seconds: i64,
    },
    /// A per-request maximum (a card's "per authorization" limit): a request whose amount
    /// exceeds `limit` is denied by this policy, with `retry_after_seconds: null`; nothing
    /// accumulates (`used` is the request's amount in a consume answer, 0 in usage).
    Request {},
    /// Usage that never resets (a prepaid card's lifetime cap): `resets_at` is null and a
    /// denial has `retry_after_seconds: null`. The ledger must be kept forever
    /// (`QUOTA_LEDGER_RETENTION_DAYS=forever`), since counters are rebuilt from all of it.
    Lifetime {},
}

/// A calendar period.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PeriodDto {
    /// Each minute.
    Minute,
    /// Each hour.
    Hour,
    /// Each local day.
    Day,
    /// Each ISO week (Monday).
    Week,
    /// Each calendar month.
    Month,
    /// Each calendar year.
    Year,
}

/// A day of the week (the schema of `week_start`, which `domain::Anchors` parses).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WeekdayDto {
    /// Monday.
    Monday,
    /// Tuesday.
    Tuesday,
    /// Wednesday.
    Wednesday,
    /// Thursday.
    Thursday,
    /// Friday.
    Friday,
    /// Saturday.
    Saturday,
    /// Sunday.
    Sunday,
}

/// What a consume charges.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MeasureDto {
    /// 1 per consume.
    Count,
    /// The request's `amount`.
    Amount,
}

/// Whether a policy denies.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ModeDto {
    /// Denies over the limit.
    Enforce,
    /// Counts and reports, never denies.
    Shadow,
}

/// What the ledger keeps of a policy's consumes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RecordDto {
    /// One ledger entry per consume (the default).
    Entries,
    /// The ledger's totals per budget and counter period (`ledger_totals`).
    Totals,
}

/// A policy as submitted by `POST` (with `id`) or `PUT` (id from the path).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyInput {
    /// 1-64 chars of `[a-z0-9._-]`; required on `POST`, must match the path on `PUT`.
    #[schema(value_type = Option<Slug>, example = "transfer-usd-daily")]
    pub(crate) id: Option<String>,
    /// The action limited; 1-64 chars of `[a-z0-9._-]`.
    #[schema(value_type = Slug, example = "transfer")]
    pub(crate) action: String,
    /// `count` charges 1 per consume, `amount` charges the request's amount.
    pub(crate) measure: MeasureDto,
    /// Display label of the units, e.g. `USD cents`; at most 64 characters.
    #[schema(example = "USD cents", max_length = 64)]
    pub(crate) unit: Option<String>,
    /// Integer in [0, 2^53-1].
    #[serde(deserialize_with = "whole_number")]
    #[schema(example = 200000, minimum = 0, maximum = 9007199254740991_i64)]
    pub(crate) limit: i64,
    /// The time window.
    pub(crate) window: WindowDto,
    /// Default `enforce`.
    pub(crate) mode: Option<ModeDto>,
    /// Default true.
    pub(crate) enabled: Option<bool>,
    /// Default false: record denied attempts in the ledger too.
    pub(crate) ledger_denials: Option<bool>,
    /// Free text, at most 1,024 characters.
    #[schema(max_length = 1024)]
    pub(crate) description: Option<String>,
    /// The keys whose values name one budget of the policy: `subject` or attribute keys
    /// (`[a-z][a-z0-9_]{0,31}`), at most 4, no repeats. Default `["subject"]`: one budget
    /// per subject. A request lacking an attribute the scope names is 422.
    #[schema(max_items = 4, example = json!(["subject"]))]
    pub(crate) scope: Option<Vec<String>>,
    /// When the policy applies: for every key (`subject` or an attribute), the request's
    /// value is one of those listed (1-64 per key). Absent or `{}`: always. With `limit: 0`
    /// it is a deny list.
    #[serde(rename = "match")]
    #[schema(example = json!({"plan": ["free"]}))]
    pub(crate) conditions: Option<BTreeMap<String, Vec<String>>>,
    /// When the policy does not apply: it applies only when, for every key, the request
    /// carries it and its value is none of those listed (1-64 per key), e.g. every country
    /// but the home one. Absent or `{}`: always. Alone or beside `match`.
    #[serde(rename = "match_not")]
    #[schema(example = json!({"country": ["US", "CA"]}))]
    pub(crate) exclusions: Option<BTreeMap<String, Vec<String>>>,
    /// Percents of the limit (1-100, at most 8, no repeats) at which each budget's usage
    /// is reported to webhooks (`budget.threshold`, and `budget.threshold.resolved` when it
    /// falls back below), once per budget, threshold and period. Shadow policies report too
    /// (a soft limit). Default `[]`: none.
    #[schema(max_items = 8, example = json!([80, 100]))]
    pub(crate) alert_thresholds: Option<Vec<i64>>,
    /// What the ledger keeps of its consumes. Default `entries`: one entry per consume.
    /// `totals`: a consume that charges only policies recording totals, without an
    /// `idempotency_key`, writes no entry (its answer's `consumption_id` is null) and is
    /// added to the ledger's totals per budget and counter period instead
    /// (`ledger_totals`); a consume that writes an entry records these policies' shares in
    /// it. Not for a `token_bucket` window (422).
    pub(crate) record: Option<RecordDto>,
}

/// A policy as created by `POST`: a [`PolicyInput`] whose `id` is required.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub(crate) struct NewPolicyInput(pub(crate) PolicyInput);

/// [`PolicyInput`]'s schema, with `id` a required [`Slug`]: one object, not an `allOf`
/// narrowing a nullable field, which generators cannot merge.
impl PartialSchema for NewPolicyInput {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(mut object)) = PolicyInput::schema() else {
            unreachable!("PolicyInput derives an object schema")
        };
        object
            .properties
            .insert("id".to_owned(), Ref::from_schema_name(Slug::name()).into());
        object.required.insert(0, "id".to_owned());
        object.description = Some("A policy as created by `POST`: `id` is required.".into());
        RefOr::T(Schema::Object(object))
    }
}

impl ToSchema for NewPolicyInput {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Slug::name().into_owned(), Slug::schema()));
        PolicyInput::schemas(schemas);
    }
}

/// A stored policy.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyOut {
    /// Unique id.
    pub(crate) id: String,
    /// The action limited.
    pub(crate) action: String,
    /// `count` or `amount`.
    pub(crate) measure: MeasureDto,
    /// Display label of the units.
    pub(crate) unit: Option<String>,
    /// The limit per window.
    pub(crate) limit: u64,
    /// The time window.
    pub(crate) window: WindowDto,
    /// `enforce` or `shadow`.
    pub(crate) mode: ModeDto,
    /// Whether consumes check it.
    pub(crate) enabled: bool,
    /// Whether denied attempts are recorded in the ledger.
    pub(crate) ledger_denials: bool,
    /// Free text.
    pub(crate) description: String,
    /// The keys whose values name one budget (`["subject"]`: one per subject).
    pub(crate) scope: Vec<String>,
    /// When it applies (`{}`: always).
    #[serde(rename = "match")]
    pub(crate) conditions: BTreeMap<String, Vec<String>>,
    /// When it does not (`{}`: never excluded).
    #[serde(rename = "match_not")]
    pub(crate) exclusions: BTreeMap<String, Vec<String>>,
    /// Percents of the limit at which budgets' usage is reported, ascending (`[]`: none).
    pub(crate) alert_thresholds: Vec<u8>,
    /// `entries` or `totals`.
    pub(crate) record: RecordDto,
    /// When it was created.
    pub(crate) created_at: DateTime<Utc>,
    /// When it last changed.
    pub(crate) updated_at: DateTime<Utc>,
    /// +1 on every change; also the `ETag`.
    pub(crate) version: i64,
}

/// A page of policies.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyList {
    /// The policies, ordered by id.
    pub(crate) items: Vec<PolicyOut>,
    /// Always null: every matching policy is in `items`.
    pub(crate) next_cursor: Option<String>,
}

/// An override as submitted.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OverrideInput {
    /// The limit for this subject, replacing the policy's; [0, 2^53-1] (a token bucket's
    /// window bounds it further, as it bounds the policy's).
    #[serde(deserialize_with = "whole_number")]
    #[schema(example = 500000, minimum = 0, maximum = 9007199254740991_i64)]
    pub(crate) limit: i64,
    /// When the override stops applying (RFC 3339); absent for never.
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Why it exists, at most 1,024 characters.
    #[schema(max_length = 1024)]
    pub(crate) note: Option<String>,
}

/// A stored override.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OverrideOut {
    /// The policy it belongs to.
    pub(crate) policy_id: String,
    /// The subject it applies to.
    pub(crate) subject: String,
    /// The limit for this subject.
    pub(crate) limit: u64,
    /// When it stops applying; null for never.
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Why it exists.
    pub(crate) note: Option<String>,
    /// When it was created.
    pub(crate) created_at: DateTime<Utc>,
    /// When it last changed.
    pub(crate) updated_at: DateTime<Utc>,
}

/// A page of overrides.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OverrideList {
    /// The overrides, ordered by subject.
    pub(crate) items: Vec<OverrideOut>,
    /// Always null: every override is in `items`.
    pub(crate) next_cursor: Option<String>,
}

const MAX_TEXT: usize = 1_024;
