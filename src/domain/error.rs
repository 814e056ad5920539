//! Validation failures that name the offending field.

use std::fmt;

/// One invalid field: which one (a JSON path such as `window.timezone`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path in the request body or query, e.g. `window.bucket_seconds`.
    pub(crate) field: String,
    /// A sentence a person can act on.
    pub(crate) message: String,
}

impl FieldError {
    /// Builds a field error.
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Prefixes the field path, e.g. `timezone` becomes `window.timezone`.
    pub(crate) fn within(mut self, parent: &str) -> Self {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every invalid field of one input, collected so the client sees them all at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldErrors(pub(crate) Vec<FieldError>);

impl FieldErrors {
    /// Records the error of `result` (if any) and returns its value.
    pub(crate) fn take<T>(&mut self, result: Result<T, FieldError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.0.push(error);
                None
            }
        }
    }

    /// Records one error.
    pub(crate) fn push(&mut self, error: FieldError) {
        self.0.push(error);
    }

    /// `Ok(value)` when nothing was recorded, the collected errors otherwise.
    pub(crate) fn finish<T>(self, value: impl FnOnce() -> T) -> Result<T, FieldErrors> {
        if self.0.is_empty() {
            Ok(value())
        } else {
            Err(self)
        }
    }
}

impl From<FieldError> for FieldErrors {
    fn from(error: FieldError) -> Self {
        Self(vec![error])
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for FieldErrors {}
