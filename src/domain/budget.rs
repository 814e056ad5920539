//! Budgets: a request's attributes, a policy's scope (which values name one budget) and its
//! `match` conditions (when it applies at all).
//!
//! A policy counts per **budget**: the values of its scope's keys in one request. The
//! default scope `["subject"]` is one budget per subject (what every policy counted before
//! scopes existed); `["subject", "org"]` one per subject and org.

use super::{FieldError, FieldErrors, Subject};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The key that names the subject in a scope or a `match`; no attribute may take it.
pub const SUBJECT_KEY: &str = "subject";

/// The most attributes one request may carry.
pub const MAX_ATTRIBUTES: usize = 16;

/// The most keys a scope may name.
pub const MAX_SCOPE_KEYS: usize = 4;

/// The most values one `match` key may list.
pub const MAX_MATCH_VALUES: usize = 64;

/// The longest attribute value, in characters.
const MAX_VALUE_CHARS: usize = 128;

/// Whether `key` is an attribute key: `[a-z][a-z0-9_]{0,31}`.
fn is_attribute_key(key: &str) -> bool {
    let mut chars = key.chars();
    key.len() <= 32
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn check_key(field: &str, key: &str) -> Result<(), FieldError> {
    if is_attribute_key(key) {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("'{key}' is not a key: 1-32 characters of [a-z0-9_], starting with a letter"),
        ))
    }
}

fn check_value(field: &str, value: &str) -> Result<(), FieldError> {
    let chars = value.chars().count();
    if chars == 0 || chars > MAX_VALUE_CHARS || value.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must be 1 to 128 printable characters (no control characters)",
        ));
    }
    Ok(())
}

/// A request's attributes: at most 16 keys `[a-z][a-z0-9_]{0,31}` (never `subject`), each
/// with a value of 1-128 printable characters. Kept sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Attributes(BTreeMap<String, String>);

impl Attributes {
    /// Parses `pairs`, naming `field` (e.g. `attributes`) in every error.
    pub fn parse(
        field: &str,
        pairs: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let mut map = BTreeMap::new();
        for (key, value) in pairs {
            let path = format!("{field}.{key}");
            if key == SUBJECT_KEY {
                errors.push(FieldError::new(
                    path,
                    "'subject' is reserved: the request's subject is its own field",
                ));
                continue;
            }
            if errors.take(check_key(field, &key)).is_none() {
                continue;
            }
            if errors.take(check_value(&path, &value)).is_some() {
                map.insert(key, value);
            }
        }
        if map.len() > MAX_ATTRIBUTES {
            errors.push(FieldError::new(
                field,
                format!("at most {MAX_ATTRIBUTES} attributes"),
            ));
        }
        errors.finish(|| Self(map))
    }

    /// The value of `key`, if the request carries it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The attributes, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// One key of a scope or a `match`: the subject, or an attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKey {
    /// The request's subject.
    Subject,
    /// An attribute of the request.
    Attr(String),
}

impl ScopeKey {
    /// Parses `subject` or an attribute key, naming `field` in the error.
    pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
        if text == SUBJECT_KEY {
            return Ok(Self::Subject);
        }
        check_key(field, text).map(|()| Self::Attr(text.to_owned()))
    }

    /// The key as the wire spells it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Subject => SUBJECT_KEY,
            Self::Attr(key) => key,
        }
    }

    /// This key's value in a request, if it has one.
    fn value_in<'a>(&self, subject: &'a Subject, attributes: &'a Attributes) -> Option<&'a str> {
        match self {
            Self::Subject => Some(subject.as_str()),
            Self::Attr(key) => attributes.get(key),
        }
    }
}

/// The keys whose values name one budget of a policy: 0-4 of them, no repeats, in the
/// operator's order. `[]` is one budget for the whole action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(Vec<ScopeKey>);

impl Default for Scope {
    /// `["subject"]`: one budget per subject.
    fn default() -> Self {
        Self(vec![ScopeKey::Subject])
    }
}

impl Scope {
    /// Parses the keys of `texts`, naming `field[i]` in each error.
    pub fn parse<S: AsRef<str>>(field: &str, texts: &[S]) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        if texts.len() > MAX_SCOPE_KEYS {
            errors.push(FieldError::new(
                field,
                format!("at most {MAX_SCOPE_KEYS} keys"),
            ));
        }
        let mut keys = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let path = format!("{field}[{i}]");
            let Some(key) = errors.take(ScopeKey::parse(&path, text.as_ref())) else {
                continue;
            };
            if keys.contains(&key) {
                errors.push(FieldError::new(
                    path,
                    format!("'{}' is repeated", key.as_str()),
                ));
                continue;
            }
            keys.push(key);
        }
        errors.finish(|| Self(keys))
    }

    /// Whether this is `["subject"]`, the scope of every policy before scopes existed.
    pub fn is_default(&self) -> bool {
        self.0 == [ScopeKey::Subject]
    }

    /// Whether it names the subject: every budget then belongs to one subject.
    pub fn has_subject(&self) -> bool {
        self.0.contains(&ScopeKey::Subject)
    }

    /// The keys, in the operator's order.
    pub fn keys(&self) -> &[ScopeKey] {
        &self.0
    }

    /// The budget a request falls in; a request lacking one of the scope's attributes is
    /// refused (a budget is never skipped silently), naming `attributes.<key>`.
    pub fn budget(
        &self,
        policy: &str,
        subject: &Subject,
        attributes: &Attributes,
    ) -> Result<Budget, FieldError> {
        self.0
            .iter()
            .map(|key| match key.value_in(subject, attributes) {
                Some(value) => Ok((key.clone(), value.to_owned())),
                None => Err(FieldError::new(
                    format!("attributes.{}", key.as_str()),
                    format!("required by the scope of policy '{policy}'"),
                )),
            })
            .collect::<Result<_, _>>()
            .map(Budget)
    }

    /// The budget a request falls in, with only the keys it has values for (what a ledger
    /// entry, whose request was checked against the scope, always has).
    pub fn budget_of(&self, subject: &Subject, attributes: &Attributes) -> Budget {
        Budget(
            self.0
                .iter()
                .filter_map(|key| {
                    key.value_in(subject, attributes)
                        .map(|value| (key.clone(), value.to_owned()))
                })
                .collect(),
        )
    }

    /// The scope's keys joined by `,` (empty for a global scope): its compact form.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.0.iter().map(ScopeKey::as_str).collect();
        names.join(",")
    }

    /// Reads what [`Scope::names`] wrote.
    pub(crate) fn from_names(text: &str) -> Result<Self, FieldErrors> {
        let names: Vec<&str> = match text {
            "" => Vec::new(),
            _ => text.split(',').collect(),
        };
        Self::parse("scope", &names)
    }
}

/// When a policy applies: for every key, the request's value is one of those listed. Empty,
/// it always applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Match(BTreeMap<ScopeKey, BTreeSet<String>>);

impl Match {
    /// Parses `{key: [value, ...]}` (1-64 values per key), naming `field.<key>` in errors.
    pub(crate) fn parse(
        field: &str,
        entries: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let mut map = BTreeMap::new();
        for (key, values) in entries {
            let path = format!("{field}.{key}");
            let Some(parsed) = errors.take(ScopeKey::parse(&path, &key)) else {
                continue;
            };
            if values.is_empty() || values.len() > MAX_MATCH_VALUES {
                errors.push(FieldError::new(
                    &path,
                    format!("must list 1 to {MAX_MATCH_VALUES} values"),
                ));
                continue;
            }
            let mut set = BTreeSet::new();
            for (i, value) in values.into_iter().enumerate() {
                let item = format!("{path}[{i}]");
                let checked = match parsed {
                    ScopeKey::Subject => Subject::parse(&item, &value).map(|_| ()),
                    ScopeKey::Attr(_) => check_value(&item, &value),
                };
                if errors.take(checked).is_some() {
                    set.insert(value);
                }
            }
            map.insert(parsed, set);
        }
        if map.len() > MAX_ATTRIBUTES + 1 {
            errors.push(FieldError::new(
                field,
                format!("at most {} keys", MAX_ATTRIBUTES + 1),
            ));
        }
        errors.finish(|| Self(map))
    }

    /// Whether the policy applies to a request. A request lacking a listed key does not
    /// match (it is never an error).
    pub fn admits(&self, subject: &Subject, attributes: &Attributes) -> bool {
        self.0.iter().all(|(key, values)| {
            key.value_in(subject, attributes)
                .is_some_and(|value| values.contains(value))
        })
    }

    /// Whether the policy applies to a request as a `match_not`: for every key, the request
    /// carries it and its value is none of those listed ("every country except US"). A
    /// request lacking a listed key does not match. Empty, it always applies.
    pub fn excludes(&self, subject: &Subject, attributes: &Attributes) -> bool {
        self.0.iter().all(|(key, values)| {
            key.value_in(subject, attributes)
                .is_some_and(|value| !values.contains(value))
        })
    }

    /// Whether it always applies.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The keys and their values, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// One budget of a policy: the values of its scope's keys, in scope order (empty for a
/// global budget).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Budget(Vec<(ScopeKey, String)>);

impl Budget {
    /// The budget of the default scope: `subject`'s own.
    pub fn of_subject(subject: &Subject) -> Self {
        Self(vec![(ScopeKey::Subject, subject.as_str().to_owned())])
    }

    /// The keys and values, in scope order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether this is a default-scope budget (the subject's own).
    pub fn is_subject_only(&self) -> bool {
        matches!(&self.0[..], [(ScopeKey::Subject, _)])
    }

    /// The text that names the budget in override paths: the value for a one-key scope,
    /// `*` for the global budget, else the values in scope order joined by `,` (with `%`
    /// and `,` inside a value written `%25` and `%2C`).
    pub fn text(&self) -> String {
        match &self.0[..] {
            [] => "*".to_owned(),
            [(_, value)] => value.clone(),
            values => {
                let escaped: Vec<String> = values
                    .iter()
                    .map(|(_, v)| v.replace('%', "%25").replace(',', "%2C"))
                    .collect();
                escaped.join(",")
            }
        }
    }

    /// Reads the text of [`Budget::text`] as a budget of `scope`, naming `field` in errors.
    pub fn from_text(field: &str, scope: &Scope, text: &str) -> Result<Self, FieldError> {
        let values: Vec<String> = match scope.keys() {
            [] if text == "*" => Vec::new(),
            [] => {
                return Err(FieldError::new(
                    field,
                    "the policy has one global budget: name it '*'",
                ))
            }
            [_] => vec![text.to_owned()],
            keys => {
                let parts: Vec<&str> = text.split(',').collect();
                if parts.len() != keys.len() {
                    return Err(FieldError::new(
                        field,
                        format!(
                            "must be {} values joined by ',' (the scope {}), with ',' and '%' \
                             inside a value written '%2C' and '%25'",
                            keys.len(),
                            scope.names()
                        ),
                    ));
                }
                parts
                    .iter()
                    .map(|p| unescape(field, p))
                    .collect::<Result<_, _>>()?
            }
        };
        let pairs = scope.keys().iter().cloned().zip(values);
        let mut budget = Vec::with_capacity(scope.keys().len());
        for (key, value) in pairs {
            match key {
                ScopeKey::Subject => Subject::parse(field, &value).map(|_| ())?,
                ScopeKey::Attr(_) => check_value(field, &value)?,
            }
            budget.push((key, value));
        }
        Ok(Self(budget))
    }
}

fn unescape(field: &str, text: &str) -> Result<String, FieldError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3);
        match code {
            Some("%25") => out.push('%'),
            Some("%2C") | Some("%2c") => out.push(','),
            _ => {
                return Err(FieldError::new(
                    field,
                    "'%' inside a value must start '%25' or '%2C'",
                ))
            }
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

#[cfg(test)]
mod tests;
