//! Identifiers: policy ids, actions and subjects.

use super::FieldError;
use std::fmt;

fn is_slug_char(c: char) -> bool {
    matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-')
}

fn parse_slug(field: &str, value: &str) -> Result<String, FieldError> {
    if value.is_empty() || value.len() > 64 {
        return Err(FieldError::new(field, "must be 1 to 64 characters long"));
    }
    if !value.chars().all(is_slug_char) {
        return Err(FieldError::new(
            field,
            "may contain only lowercase letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(value.to_owned())
}

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A policy's unique id: 1-64 characters of `[a-z0-9._-]`.
    PolicyId
);
string_id!(
    /// What is being limited, e.g. `sms.send`: 1-64 characters of `[a-z0-9._-]`.
    Action
);
string_id!(
    /// Who is being limited, e.g. `user-42`: 1-256 bytes of printable UTF-8.
    Subject
);

impl PolicyId {
    /// Parses a policy id, naming `field` in the error.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        parse_slug(field, value).map(Self)
    }
}

impl Action {
    /// Parses an action, naming `field` in the error.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        parse_slug(field, value).map(Self)
    }
}

impl Subject {
    /// Longest subject accepted, in bytes of UTF-8.
    pub(crate) const MAX_BYTES: usize = 256;

    /// Parses a subject: 1-256 bytes, no control characters.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        if value.is_empty() || value.len() > Self::MAX_BYTES {
            return Err(FieldError::new(field, "must be 1 to 256 bytes of UTF-8"));
        }
        if value.chars().any(char::is_control) {
            return Err(FieldError::new(
                field,
                "must be printable (no control characters)",
            ));
        }
        Ok(Self(value.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_accept_the_contract_charset_and_reject_the_rest() {
        for ok in ["a", "sms.send", "transfer-usd_daily", &"x".repeat(64)] {
            assert!(PolicyId::parse("id", ok).is_ok(), "{ok}");
            assert!(Action::parse("action", ok).is_ok(), "{ok}");
        }
        for bad in ["", "Upper", "with space", "colon:", "é", &"x".repeat(65)] {
            assert!(PolicyId::parse("id", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subjects_are_printable_utf8_up_to_256_bytes() {
        for ok in [
            "user-42",
            "{weird}:|subject",
            "Zoë ünïcode",
            &"é".repeat(128),
        ] {
            assert!(Subject::parse("subject", ok).is_ok(), "{ok}");
        }
        for bad in ["", "tab\there", "nl\n", &"é".repeat(129)] {
            assert!(Subject::parse("subject", bad).is_err(), "{bad:?}");
        }
    }
}
