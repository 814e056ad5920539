//! Which actions a caller may act on: action globs (`sms.*`), and the set a request is
//! confined to ([`ActionSet`]), which the engine consults before a refund or a settlement
//! and the ledger before it answers a read.

use super::{Action, FieldError};
use std::fmt;
use std::sync::Arc;

/// The most globs one set may hold: each is tried on every request, and each becomes a
/// condition of a ledger read.
pub const MAX_GLOBS: usize = 32;

/// An action pattern: dot-separated segments where `*` stands for any run of characters
/// within one segment, never across a dot. `sms.*` matches `sms.send` but not `sms` or
/// `sms.send.eu`; `*.send` matches `sms.send`; `sms-*` matches `sms-eu`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionGlob(String);

impl ActionGlob {
    /// Parses a glob: an action's characters (`[a-z0-9._-]`) plus `*`, 1-64 of them, and
    /// no empty segment. Names `field` in the error.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        let fail = |why: &str| Err(FieldError::new(field, format!("'{value}' {why}")));
        if value.is_empty() || value.len() > 64 {
            return fail("must be 1 to 64 characters long");
        }
        if !value
            .chars()
            .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-' | '*'))
        {
            return fail("may contain only lowercase letters, digits, '.', '_', '-' and '*'");
        }
        if value.split('.').any(str::is_empty) {
            return fail("has an empty segment (a leading, trailing or doubled '.')");
        }
        Ok(Self(value.to_owned()))
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `action` matches, segment by segment.
    pub fn matches(&self, action: &str) -> bool {
        let mut globs = self.0.split('.');
        let mut parts = action.split('.');
        loop {
            match (globs.next(), parts.next()) {
                (None, None) => return true,
                (Some(glob), Some(part)) if segment_matches(glob, part) => {}
                _ => return false,
            }
        }
    }

    /// Whether the glob has no `*`: it names one action.
    pub fn is_literal(&self) -> bool {
        !self.0.contains('*')
    }

    /// How many dot-separated segments a matching action has.
    pub fn segments(&self) -> usize {
        self.0.split('.').count()
    }

    /// The glob as a SQL `LIKE` pattern with `\` as the escape character: `*` becomes `%`,
    /// and `_` (a `LIKE` wildcard) is escaped. `%` also matches dots, so a query pairs it
    /// with the action's segment count ([`Self::segments`]).
    pub fn like_pattern(&self) -> String {
        let mut pattern = String::with_capacity(self.0.len() + 4);
        for c in self.0.chars() {
            match c {
                '*' => pattern.push('%'),
                '_' => pattern.push_str("\\_"),
                other => pattern.push(other),
            }
        }
        pattern
    }
}

impl fmt::Display for ActionGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether one segment of a glob (`*` any run, no dot in either) matches one of an action.
fn segment_matches(glob: &str, part: &str) -> bool {
    let mut pieces = glob.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = part.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty(); // no '*': the segment is literal
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The actions a request may touch: all of them (the admin token, a client token, open
/// endpoints) or those an API key's globs match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ActionSet {
    /// Every action.
    #[default]
    All,
    /// The actions at least one glob matches (shared: every request of a key clones it).
    Matching(Arc<[ActionGlob]>),
}

impl ActionSet {
    /// Whether `action` is in the set.
    pub fn contains(&self, action: &Action) -> bool {
        self.contains_str(action.as_str())
    }

    /// Whether the action named `action` is in the set.
    pub fn contains_str(&self, action: &str) -> bool {
        match self {
            Self::All => true,
            Self::Matching(globs) => globs.iter().any(|glob| glob.matches(action)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(text: &str) -> ActionGlob {
        ActionGlob::parse("actions[0]", text).expect("a valid glob")
    }

    #[test]
    fn a_star_matches_within_one_segment_and_never_across_a_dot() {
        let cases = [
            ("sms.*", "sms.send", true),
            ("sms.*", "sms", false),
            ("sms.*", "sms.send.eu", false),
            ("sms.*", "smsx.send", false),
            ("*.send", "sms.send", true),
            ("*.send", "sms.eu.send", false),
            ("*", "transfer", true),
            ("*", "sms.send", false),
            ("transfer", "transfer", true),
            ("transfer", "transfers", false),
            ("transfer", "transfe", false),
            ("sms-*", "sms-eu", true),
            ("sms-*", "sms-", true),
            ("sms-*", "sms", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("a*bc", "abcbc", true),
            ("*x", "x", true),
            ("ab*ba", "aba", false),
            ("*.*", "sms.send", true),
            ("*.*", "sms", false),
            ("sms.**", "sms.send", true),
        ];
        for (pattern, action, expected) in cases {
            assert_eq!(
                glob(pattern).matches(action),
                expected,
                "{pattern} ~ {action}"
            );
        }
    }

    #[test]
    fn malformed_globs_are_refused_naming_the_field() {
        for bad in [
            "",
            "sms..send",
            ".sms",
            "sms.",
            "SMS.*",
            "sms/x",
            &"a".repeat(65),
        ] {
            let error = ActionGlob::parse("actions[1]", bad).expect_err(bad);
            assert_eq!(error.field, "actions[1]", "{bad}");
        }
    }

    #[test]
    fn a_like_pattern_escapes_underscores_and_turns_stars_into_percents() {
        assert_eq!(glob("sms_eu.*").like_pattern(), "sms\\_eu.%");
        assert_eq!(glob("sms.*").segments(), 2);
        assert!(glob("transfer").is_literal() && !glob("sms.*").is_literal());
    }

    #[test]
    fn a_set_contains_what_one_of_its_globs_matches() {
        let set = ActionSet::Matching(vec![glob("sms.*"), glob("transfer")].into());
        assert!(set.contains_str("sms.send") && set.contains_str("transfer"));
        assert!(!set.contains_str("payout") && !set.contains_str("sms"));
        assert!(ActionSet::All.contains_str("anything.at.all"));
    }
}
