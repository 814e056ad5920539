//! From the admin API's wire shapes to the domain's types, and back.

use super::*;
use crate::domain::Record;

fn text(
    errors: &mut FieldErrors,
    field: &str,
    value: Option<String>,
    max: usize,
) -> Option<String> {
    if value.as_ref().is_some_and(|v| v.chars().count() > max) {
        errors.push(crate::domain::FieldError::new(
            field,
            format!("must be at most {max} characters"),
        ));
    }
    value
}

impl WindowDto {
    /// The window, and a calendar window's zone attribute.
    fn parse(&self) -> Result<(Window, Option<String>), crate::domain::FieldError> {
        let zone_attribute = match self {
            Self::Calendar {
                timezone_attribute: Some(key),
                ..
            } => match ScopeKey::parse("window.timezone_attribute", key)? {
                ScopeKey::Attr(key) => Some(key),
                ScopeKey::Subject => {
                    return Err(crate::domain::FieldError::new(
                        "window.timezone_attribute",
                        "must name an attribute, not the subject",
                    ))
                }
            },
            _ => None,
        };
        let window = match self {
            Self::Calendar {
                period,
                timezone,
                week_start,
                day_start,
                month_day,
                year_month,
                ..
            } => {
                let period = match period {
                    PeriodDto::Minute => CalendarPeriod::Minute,
                    PeriodDto::Hour => CalendarPeriod::Hour,
                    PeriodDto::Day => CalendarPeriod::Day,
                    PeriodDto::Week => CalendarPeriod::Week,
                    PeriodDto::Month => CalendarPeriod::Month,
                    PeriodDto::Year => CalendarPeriod::Year,
                };
                let anchors = Anchors::parse(
                    period,
                    &AnchorsInput {
                        week_start: week_start.as_deref(),
                        day_start: day_start.as_deref(),
                        month_day: *month_day,
                        year_month: *year_month,
                    },
                );
                Window::calendar(period, timezone.as_deref().unwrap_or("UTC"))
                    .and_then(|window| anchors.map(|anchors| window.anchored(anchors)))
            }
            Self::Rolling {
                seconds,
                bucket_seconds,
            } => Window::rolling(i128::from(*seconds), i128::from(*bucket_seconds)),
            Self::TokenBucket { seconds } => Window::token_bucket(i128::from(*seconds)),
            Self::Request {} => Ok(Window::Request),
            Self::Lifetime {} => Ok(Window::Lifetime),
        };
        window
            .map(|window| (window, zone_attribute))
            .map_err(|e| e.within("window"))
    }

    fn from_domain(window: &Window, zone_attribute: Option<&str>) -> Self {
        match *window {
            Window::Calendar {
                period,
                timezone,
                anchors,
            } => {
                // Only the anchors that differ from the plain calendar: a default written
                // out or left out is the same window.
                let plain = Anchors::default();
                Self::Calendar {
                    period: match period {
                        CalendarPeriod::Minute => PeriodDto::Minute,
                        CalendarPeriod::Hour => PeriodDto::Hour,
                        CalendarPeriod::Day => PeriodDto::Day,
                        CalendarPeriod::Week => PeriodDto::Week,
                        CalendarPeriod::Month => PeriodDto::Month,
                        CalendarPeriod::Year => PeriodDto::Year,
                    },
                    timezone: Some(timezone.name().to_owned()),
                    timezone_attribute: zone_attribute.map(str::to_owned),
                    week_start: (anchors.week_start != plain.week_start)
                        .then(|| anchors.week_start_name().to_owned()),
                    day_start: (anchors.day_start != plain.day_start)
                        .then(|| anchors.day_start_text()),
                    month_day: (anchors.month_day != plain.month_day)
                        .then_some(i64::from(anchors.month_day)),
                    year_month: (anchors.year_month != plain.year_month)
                        .then_some(i64::from(anchors.year_month)),
                }
            }
            Window::Rolling {
                seconds,
                bucket_seconds,
            } => Self::Rolling {
                seconds: seconds as i64,
                bucket_seconds: bucket_seconds as i64,
            },
            Window::TokenBucket { seconds } => Self::TokenBucket {
                seconds: seconds as i64,
            },
            Window::Request => Self::Request {},
            Window::Lifetime => Self::Lifetime {},
        }
    }
}

impl PolicyInput {
    /// Validates every field, returning the id (if given) and the spec, or all field errors.
    pub(crate) fn parse(self) -> Result<(Option<PolicyId>, PolicySpec), FieldErrors> {
        let mut errors = FieldErrors::default();
        let id = self
            .id
            .as_deref()
            .and_then(|id| errors.take(PolicyId::parse("id", id)));
        let action = errors.take(Action::parse("action", &self.action));
        let limit = errors.take(Quantity::parse("limit", i128::from(self.limit)));
        let (window, zone_attribute) = match errors.take(self.window.parse()) {
            Some((window, zone_attribute)) => (Some(window), zone_attribute),
            None => (None, None),
        };
        if let (Some(window), Some(limit)) = (&window, limit) {
            errors.take(window.check_limit("limit", limit.get()));
        }
        let unit = text(&mut errors, "unit", self.unit, 64);
        let description = text(&mut errors, "description", self.description, MAX_TEXT);
        let scope = match self.scope {
            None => Some(Scope::default()),
            Some(keys) => take_all(&mut errors, Scope::parse("scope", &keys)),
        };

        let conditions = match self.conditions {
            None => Some(Match::default()),
            Some(map) => take_all(&mut errors, Match::parse("match", map)),
        };
        let exclusions = match self.exclusions {
            None => Some(Match::default()),
            Some(map) => take_all(&mut errors, Match::parse("match_not", map)),
        };
        let alert_thresholds = errors.take(crate::domain::Thresholds::parse(
            "alert_thresholds",
            self.alert_thresholds.as_deref().unwrap_or(&[]),
        ));
        if window == Some(Window::Request)
            && alert_thresholds.as_ref().is_some_and(|t| !t.is_empty())
        {
            errors.0.push(crate::domain::FieldError::new(
                "alert_thresholds",
                "a request window accumulates nothing: it has no usage to alert on",
            ));
        }
        let record = record_of(self.record, window.as_ref(), &mut errors);
        let matching = conditions.zip(exclusions).zip(alert_thresholds);
        match (action, limit, window, scope, matching) {
            (
                Some(action),
                Some(limit),
                Some(window),
                Some(scope),
                Some(((conditions, exclusions), alert_thresholds)),
            ) if errors.0.is_empty() => Ok((
                id,
                PolicySpec {
                    action,
                    measure: match self.measure {
                        MeasureDto::Count => Measure::Count,
                        MeasureDto::Amount => Measure::Amount,
                    },
                    unit,
                    limit,
                    window,
                    mode: match self.mode {
                        Some(ModeDto::Shadow) => Mode::Shadow,
                        _ => Mode::Enforce,
                    },
                    enabled: self.enabled.unwrap_or(true),
                    ledger_denials: self.ledger_denials.unwrap_or(false),
                    description: description.unwrap_or_default(),
                    scope,
                    conditions,
                    exclusions,
                    zone_attribute,
                    alert_thresholds,
                    record,
                },
            )),
            _ => Err(errors),
        }
    }
}

/// The record level asked for (`entries` by default), with an error in `errors` when
/// `window` cannot record it: a token bucket's state is no sum per period.
fn record_of(
    record: Option<RecordDto>,
    window: Option<&Window>,
    errors: &mut FieldErrors,
) -> Record {
    let record = match record {
        Some(RecordDto::Totals) => Record::Totals,
        _ => Record::Entries,
    };
    if record == Record::Totals && matches!(window, Some(Window::TokenBucket { .. })) {
        errors.0.push(crate::domain::FieldError::new(
            "record",
            "a token_bucket window cannot record totals: its state is not a sum per period",
        ));
    }
    record
}

/// The value of `parsed`, or `None` with its errors added to `errors`.
fn take_all<T>(errors: &mut FieldErrors, parsed: Result<T, FieldErrors>) -> Option<T> {
    match parsed {
        Ok(value) => Some(value),
        Err(more) => {
            errors.0.extend(more.0);
            None
        }
    }
}

impl From<&Policy> for PolicyOut {
    fn from(p: &Policy) -> Self {
        Self {
            id: p.id.to_string(),
            action: p.spec.action.to_string(),
            measure: match p.spec.measure {
                Measure::Count => MeasureDto::Count,
                Measure::Amount => MeasureDto::Amount,
            },
            unit: p.spec.unit.clone(),
            limit: p.spec.limit.get(),
            window: WindowDto::from_domain(&p.spec.window, p.spec.zone_attribute.as_deref()),
            mode: match p.spec.mode {
                Mode::Enforce => ModeDto::Enforce,
                Mode::Shadow => ModeDto::Shadow,
            },
            enabled: p.spec.enabled,
            ledger_denials: p.spec.ledger_denials,
            description: p.spec.description.clone(),
            scope: p
                .spec
                .scope
                .keys()
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect(),
            conditions: p
                .spec
                .conditions
                .iter()
                .map(|(k, values)| (k.to_owned(), values.iter().cloned().collect()))
                .collect(),
            exclusions: p
                .spec
                .exclusions
                .iter()
                .map(|(k, values)| (k.to_owned(), values.iter().cloned().collect()))
                .collect(),
            alert_thresholds: p.spec.alert_thresholds.percents().to_vec(),
            record: match p.spec.record {
                Record::Entries => RecordDto::Entries,
                Record::Totals => RecordDto::Totals,
            },
            created_at: p.created_at,
            updated_at: p.updated_at,
            version: p.version,
        }
    }
}

impl OverrideInput {
    /// Validates the override against its policy's window.
    pub(crate) fn parse(self, window: &Window) -> Result<OverrideSpec, FieldErrors> {
        let mut errors = FieldErrors::default();
        let limit = errors.take(Quantity::parse("limit", i128::from(self.limit)));
        if let Some(limit) = limit {
            errors.take(window.check_limit("limit", limit.get()));
        }
        let note = text(&mut errors, "note", self.note, MAX_TEXT);
        match limit {
            Some(limit) if errors.0.is_empty() => Ok(OverrideSpec {
                limit,
                expires_at: self.expires_at,
                note,
            }),
            _ => Err(errors),
        }
    }
}

impl From<&Override> for OverrideOut {
    fn from(o: &Override) -> Self {
        Self {
            policy_id: o.policy_id.to_string(),
            subject: o.subject.to_string(),
            limit: o.spec.limit.get(),
            expires_at: o.spec.expires_at,
            note: o.spec.note.clone(),
            created_at: o.created_at,
            updated_at: o.updated_at,
        }
    }
}
