//! Counter keys: the only place where Redis (and memory-store) keys are formatted.
//!
//! Layout: `<prefix>:{<action>|<subject>}:<policy id>:<measure><window fingerprint>[:<period>]`.
//!
//! - The part in braces is the Redis Cluster **hash tag**: every key of one
//!   (action, subject) hashes to the same slot, so one Lua script may touch them all.
//! - The encoding is injective: actions never contain `|`, and the subject is
//!   percent-escaped for `%`, `{` and `}` so it cannot end the tag early or collide.
//! - The limit is not part of the key (raising it keeps today's usage); the window and
//!   the measure are (changing either starts counting afresh).

use crate::domain::{Action, Policy, Subject};
use std::fmt::Write;

/// Appends `subject` to `out`, escaping `%`, `{` and `}` as `%25`, `%7B`, `%7D`.
fn push_escaped(out: &mut String, subject: &str) {
    for c in subject.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            _ => out.push(c),
        }
    }
}

/// The key prefix shared by all keys of one (action, subject), hash tag included.
pub fn subject_prefix(prefix: &str, action: &Action, subject: &Subject) -> String {
    let mut key =
        String::with_capacity(prefix.len() + action.as_str().len() + subject.as_str().len() + 48);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(action.as_str());
    key.push('|');
    push_escaped(&mut key, subject.as_str());
    key.push('}');
    key
}

/// The counter key of `policy` under `subject_prefix`; `period` names a calendar period.
pub fn counter_key(subject_prefix: &str, policy: &Policy, period: Option<i64>) -> String {
    let mut key = String::with_capacity(subject_prefix.len() + 48);
    key.push_str(subject_prefix);
    key.push(':');
    key.push_str(policy.id.as_str());
    key.push(':');
    key.push(match policy.spec.measure {
        crate::domain::Measure::Count => 'n',
        crate::domain::Measure::Amount => 'a',
    });
    key.push_str(&policy.spec.window.fingerprint());
    if let Some(period) = period {
        // Writing to a String cannot fail.
        let _ = write!(key, ":{period}");
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix_of(subject: &str) -> String {
        let action = Action::parse("action", "sms.send").expect("valid");
        subject_prefix("ql", &action, &Subject::parse("s", subject).expect("valid"))
    }

    #[test]
    fn the_hash_tag_holds_action_and_subject_whatever_the_subject_contains() {
        for subject in ["user-42", "{evil}", "a}b{c", "50%", "x:y|z", "Zoë ünïcode"] {
            let key = prefix_of(subject);
            let open = key.find('{').expect("has a tag");
            let close = key[open..].find('}').expect("tag closes") + open;
            assert_eq!(close, key.len() - 1, "the tag must end the prefix: {key}");
        }
    }

    #[test]
    fn different_subjects_never_share_a_key() {
        let subjects = ["a", "a%7D", "a}", "a%", "a%25", "{a", "%7Ba", "a|b", "a b"];
        let keys: std::collections::HashSet<String> =
            subjects.iter().map(|s| prefix_of(s)).collect();
        assert_eq!(keys.len(), subjects.len());
    }
}
