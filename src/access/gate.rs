//! The one decision every request goes through: who is calling, and may it do this.

use super::key::{hash_of, Operation};
use super::ring::{Grant, KeyRing};
use crate::clock::Clock;
use crate::config::Secret;
use crate::domain::ActionSet;
use std::sync::Arc;
use subtle::{Choice, ConstantTimeEq};

/// Why a request was refused as unauthenticated (401); `/metrics` counts each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No bearer token where one is required.
    Missing,
    /// A token that is neither a configured token nor a known key.
    Unknown,
    /// A key past its `expires_at`.
    Expired,
    /// A revoked key.
    Revoked,
}

impl Failure {
    /// The reason's label in `/metrics`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denial {
    /// 401: the caller is not known (or no longer).
    Unauthenticated(Failure),
    /// 403: a known key that may not do this; the sentence says what it lacks.
    Forbidden(String),
}

impl Denial {
    /// The reason's label in `/metrics`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Unauthenticated(failure) => failure.as_str(),
            Self::Forbidden(_) => "forbidden",
        }
    }
}

/// What a request may do, by its bearer token: the tokens configured at start, and the
/// keys of the [`KeyRing`].
pub(crate) struct Gate {
    admin: Secret,
    clients: Vec<Secret>,
    keys: Arc<KeyRing>,
    clock: Arc<dyn Clock>,
}

/// Who called, once known.
enum Caller {
    /// A configured token: the admin token, a client token (every quota operation on every
    /// action), or both when they are the same text.
    Token {
        /// It is the admin token.
        admin: bool,
        /// It is a client token.
        client: bool,
    },
    /// An API key that is neither expired nor revoked.
    Key(Arc<Grant>),
}

impl Gate {
    /// A gate for the admin token, the client tokens and the keys of `keys`, telling
    /// expiry by `clock`.
    pub(crate) fn new(
        admin: Secret,
        clients: Vec<Secret>,
        keys: Arc<KeyRing>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            admin,
            clients,
            keys,
            clock,
        }
    }

    /// Whether the quota endpoints are open: no client token is set and no key exists.
    pub(crate) fn quota_open(&self) -> bool {
        self.clients.is_empty() && !self.keys.any()
    }

    /// May the bearer of `token` (`None`: no `Authorization`) use `op`? The actions it may
    /// act on if so. The admin token may read usage, the ledger and `/admin/*`; a client
    /// token may use every quota operation; a key what it was given. While the quota
    /// endpoints are open, anyone may use them.
    pub(crate) fn admit(&self, token: Option<&str>, op: Operation) -> Result<ActionSet, Denial> {
        if op != Operation::AdminRead && self.quota_open() {
            return Ok(ActionSet::All);
        }
        let caller = self.identify(token).map_err(Denial::Unauthenticated)?;
        match caller {
            Caller::Token { admin, client } => {
                let may = match op {
                    Operation::AdminRead => admin,
                    Operation::Usage | Operation::Ledger => admin || client,
                    _ => client,
                };
                match may {
                    true => Ok(ActionSet::All),
                    false => Err(Denial::Unauthenticated(Failure::Unknown)),
                }
            }
            Caller::Key(grant) if grant.operations.contains(op) => Ok(grant.actions.clone()),
            Caller::Key(grant) => Err(Denial::Forbidden(format!(
                "API key '{}' ({}) may not use the '{}' operation",
                grant.name,
                grant.id,
                op.as_str()
            ))),
        }
    }

    /// May the bearer of `token` change `/admin/*`? Only the admin token may: a known key
    /// is refused with 403, anything else with 401.
    pub(crate) fn admit_admin_write(&self, token: Option<&str>) -> Result<(), Denial> {
        match self.identify(token).map_err(Denial::Unauthenticated)? {
            Caller::Token { admin: true, .. } => Ok(()),
            Caller::Token { .. } => Err(Denial::Unauthenticated(Failure::Unknown)),
            Caller::Key(grant) => Err(Denial::Forbidden(format!(
                "API key '{}' ({}) may only read: changes need the admin token",
                grant.name, grant.id
            ))),
        }
    }

    /// Who `token` is, for a caller that may read `/admin/*`: the admin token (`None`), or
    /// the key (`Some`), which may only read.
    pub(crate) fn reader(&self, token: Option<&str>) -> Result<Option<Arc<Grant>>, Denial> {
        match self.identify(token).map_err(Denial::Unauthenticated)? {
            Caller::Token { admin: true, .. } => Ok(None),
            Caller::Key(grant) if grant.operations.contains(Operation::AdminRead) => {
                Ok(Some(grant))
            }
            Caller::Key(grant) => Err(Denial::Forbidden(format!(
                "API key '{}' ({}) may not use the 'admin:read' operation",
                grant.name, grant.id
            ))),
            Caller::Token { .. } => Err(Denial::Unauthenticated(Failure::Unknown)),
        }
    }

    /// Which caller `token` stands for.
    fn identify(&self, token: Option<&str>) -> Result<Caller, Failure> {
        let given = token.ok_or(Failure::Missing)?.as_bytes();
        let admin = bool::from(token_matches(given, self.admin.expose().as_bytes()));
        // Every client token is compared, also after a match: the time says nothing of which.
        let client = bool::from(self.clients.iter().fold(Choice::from(0), |found, t| {
            found | token_matches(given, t.expose().as_bytes())
        }));
        if admin || client {
            return Ok(Caller::Token { admin, client });
        }
        if !self.keys.any() {
            return Err(Failure::Unknown);
        }
        // Keys are never compared: their hashes are looked up, and a hash tells nothing
        // of the secret.
        let grant = std::str::from_utf8(given)
            .ok()
            .and_then(|text| self.keys.get(&hash_of(text)))
            .ok_or(Failure::Unknown)?;
        if grant.revoked {
            return Err(Failure::Revoked);
        }
        let now = self.clock.now();
        if grant.expires_at.is_some_and(|at| at <= now) {
            return Err(Failure::Expired);
        }
        grant.touch(now);
        Ok(Caller::Key(grant))
    }
}

/// Whether `given` equals `secret`, in time that depends only on `given`'s length.
///
/// `subtle`'s slice comparison returns at once when the lengths differ, which would tell
/// a caller timing it whether it guessed the secret's length; so the lengths are compared
/// as numbers and `given` is compared byte by byte with `secret` repeated to its length.
pub(crate) fn token_matches(given: &[u8], secret: &[u8]) -> Choice {
    let same_length = given.len().ct_eq(&secret.len());
    given
        .iter()
        .zip(secret.iter().cycle())
        .fold(same_length, |equal, (g, s)| equal & g.ct_eq(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::key::{new_secret, KeyRecord, Operations};
    use crate::clock::FakeClock;
    use crate::domain::ActionGlob;
    use chrono::{TimeZone, Utc};

    #[test]
    fn a_token_matches_only_the_whole_secret() {
        let cases: [(&[u8], &[u8], bool); 9] = [
            (b"secret", b"secret", true),
            (b"", b"", true),
            (b"secret", b"secreT", false),
            (b"secret", b"secret2", false),
            (b"secret2", b"secret", false),
            (b"secretsecret", b"secret", false),
            (b"sec", b"secret", false),
            (b"", b"x", false),
            (b"x", b"", false),
        ];
        for (given, secret, expected) in cases {
            assert_eq!(
                bool::from(token_matches(given, secret)),
                expected,
                "{given:?} against {secret:?}"
            );
        }
    }

    #[test]
    fn each_caller_gets_what_it_was_given_and_nothing_more() {
        let now = Utc
            .with_ymd_and_hms(2026, 11, 27, 12, 0, 0)
            .single()
            .expect("an instant");
        let clock = Arc::new(FakeClock::new(now));
        let ring = Arc::new(KeyRing::new());
        let gate = Gate::new(
            Secret::new("admin"),
            Vec::new(),
            ring.clone(),
            clock.clone(),
        );
        assert!(gate.quota_open());
        assert_eq!(gate.admit(None, Operation::Consume), Ok(ActionSet::All));

        let secret = new_secret();
        ring.install(vec![KeyRecord {
            id: "key_a".to_owned(),
            name: "sms".to_owned(),
            prefix: secret.prefix.clone(),
            secret_hash: secret.secret_hash.clone(),
            actions: vec![ActionGlob::parse("actions[0]", "sms.*").expect("a glob")],
            operations: Operations::default_for_keys(),
            expires_at: Some(now + chrono::Duration::hours(1)),
            created_at: now,
            revoked_at: None,
            last_used_at: None,
        }]);
        assert!(
            !gate.quota_open(),
            "the first key closes the quota endpoints"
        );
        let key = Some(secret.key.as_str());
        let scoped = gate
            .admit(key, Operation::Consume)
            .expect("a key may consume");
        assert!(scoped.contains_str("sms.send") && !scoped.contains_str("transfer"));
        assert!(matches!(
            gate.admit(key, Operation::AdminRead),
            Err(Denial::Forbidden(_))
        ));
        assert!(matches!(
            gate.admit_admin_write(key),
            Err(Denial::Forbidden(_))
        ));
        assert_eq!(
            gate.admit(None, Operation::Consume),
            Err(Denial::Unauthenticated(Failure::Missing))
        );
        assert_eq!(
            gate.admit(Some("qlk_nope"), Operation::Consume),
            Err(Denial::Unauthenticated(Failure::Unknown))
        );
        assert_eq!(
            gate.admit(Some("admin"), Operation::Ledger),
            Ok(ActionSet::All)
        );
        assert_eq!(
            gate.admit(Some("admin"), Operation::Consume),
            Err(Denial::Unauthenticated(Failure::Unknown))
        );
        assert_eq!(gate.admit_admin_write(Some("admin")), Ok(()));

        // A token that is both the admin token and a client token is both.
        let both = Gate::new(
            Secret::new("same"),
            vec![Secret::new("same")],
            ring.clone(),
            clock.clone(),
        );
        for op in Operation::ALL {
            assert_eq!(both.admit(Some("same"), op), Ok(ActionSet::All), "{op:?}");
        }
        assert_eq!(both.admit_admin_write(Some("same")), Ok(()));

        clock.set(now + chrono::Duration::hours(1));
        assert_eq!(
            gate.admit(key, Operation::Consume),
            Err(Denial::Unauthenticated(Failure::Expired))
        );
    }
}
