//! An API key as stored (never its secret), what it may do, and how a secret is made and
//! hashed.

use crate::domain::{ActionGlob, FieldError};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

/// What a key may be used for; each names a group of endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Operation {
    /// `POST /quota/consume`, and Envoy's `ShouldRateLimit` over gRPC.
    Consume,
    /// `POST /quota/check`.
    Check,
    /// `GET /quota/usage`.
    Usage,
    /// `POST /quota/refund`.
    Refund,
    /// `POST /quota/holds` and the commit and release of a hold.
    Holds,
    /// `GET /quota/ledger`.
    Ledger,
    /// `GET /admin/*` and the console, read-only.
    AdminRead,
}

impl Operation {
    /// Every operation, in the order the API lists them.
    pub(crate) const ALL: [Operation; 7] = [
        Self::Consume,
        Self::Check,
        Self::Usage,
        Self::Refund,
        Self::Holds,
        Self::Ledger,
        Self::AdminRead,
    ];

    /// The operation's name on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Check => "check",
            Self::Usage => "usage",
            Self::Refund => "refund",
            Self::Holds => "holds",
            Self::Ledger => "ledger",
            Self::AdminRead => "admin:read",
        }
    }

    /// Parses a name, naming `field` in the error.
    pub(crate) fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
        Self::ALL
            .into_iter()
            .find(|op| op.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|op| op.as_str()).collect();
                FieldError::new(
                    field,
                    format!("unknown operation '{text}'; one of {}", known.join(", ")),
                )
            })
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of operations, as bits: checked on every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Operations(u8);

impl Operations {
    /// What a key gets when its creator names no operations: all but `admin:read`.
    pub(crate) fn default_for_keys() -> Self {
        Operation::ALL
            .into_iter()
            .filter(|op| *op != Operation::AdminRead)
            .collect()
    }

    /// Whether `op` is in the set.
    pub(crate) fn contains(self, op: Operation) -> bool {
        self.0 & op.bit() != 0
    }

    /// The operations in the set, in [`Operation::ALL`]'s order.
    pub(crate) fn iter(self) -> impl Iterator<Item = Operation> {
        Operation::ALL
            .into_iter()
            .filter(move |op| self.contains(*op))
    }
}

impl FromIterator<Operation> for Operations {
    fn from_iter<I: IntoIterator<Item = Operation>>(ops: I) -> Self {
        Self(ops.into_iter().fold(0, |bits, op| bits | op.bit()))
    }
}

/// One API key as the store keeps it: everything but the secret, of which only the
/// SHA-256 is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRecord {
    /// `key_` and a time-ordered random id: how the API and the CLI name the key.
    pub(crate) id: String,
    /// What the key is for, as its creator put it.
    pub(crate) name: String,
    /// The key's first characters (`qlk_` and 8 more), to recognise it in a list.
    pub(crate) prefix: String,
    /// SHA-256 of the whole key, lowercase hex.
    pub(crate) secret_hash: String,
    /// The actions it may act on.
    pub(crate) actions: Vec<ActionGlob>,
    /// The operations it may use.
    pub(crate) operations: Operations,
    /// After this instant the key is refused (401); `None`: never expires.
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub(crate) created_at: DateTime<Utc>,
    /// When it was revoked; a revoked key is refused (401) and stays listed.
    pub(crate) revoked_at: Option<DateTime<Utc>>,
    /// When it was last accepted, as last written down (every few seconds, off the hot path).
    pub(crate) last_used_at: Option<DateTime<Utc>>,
}

/// The text every key starts with: secret scanners look for it.
pub(crate) const KEY_PREFIX: &str = "qlk_";

/// A freshly made key: the secret (shown once) and what is kept of it.
#[derive(Debug)]
pub(crate) struct NewSecret {
    /// The whole key, `qlk_` and 43 characters of base64url: shown once, never stored.
    pub(crate) key: String,
    /// Its first 12 characters, kept to recognise it.
    pub(crate) prefix: String,
    /// SHA-256 of `key`, lowercase hex: what is kept.
    pub(crate) secret_hash: String,
}

/// Makes a key: 32 bytes of the operating system's randomness (by way of two version 4
/// UUIDs' 244 random bits, from a cryptographically secure generator), base64url-encoded
/// after [`KEY_PREFIX`].
pub(crate) fn new_secret() -> NewSecret {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    let key = format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let prefix = key.chars().take(KEY_PREFIX.len() + 8).collect();
    let secret_hash = hex(&hash_of(&key));
    NewSecret {
        key,
        prefix,
        secret_hash,
    }
}

/// SHA-256 of a presented key. A key has 244 random bits, so a fast unsalted hash is
/// enough: there is no dictionary to try, and the hot path hashes every request's key.
pub(crate) fn hash_of(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut text, b| {
        let _ = write!(text, "{b:02x}");
        text
    })
}

/// The 32 bytes a lowercase hex digest stands for; `None` if it is not one.
pub(crate) fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_prefixed_random_and_kept_only_as_its_hash() {
        let a = new_secret();
        let b = new_secret();
        assert!(
            a.key.starts_with("qlk_") && a.key.len() == 4 + 43,
            "{}",
            a.key
        );
        assert_ne!(a.key, b.key);
        assert!(a.key.starts_with(&a.prefix) && a.prefix.len() == 12);
        assert_eq!(unhex(&a.secret_hash), Some(hash_of(&a.key)));
        assert!(!a.secret_hash.contains(&a.key[4..]));
    }

    #[test]
    fn operations_parse_by_name_and_default_to_all_but_admin_read() {
        for op in Operation::ALL {
            assert_eq!(Operation::parse("operations[0]", op.as_str()), Ok(op));
        }
        let error = Operation::parse("operations[2]", "delete").expect_err("unknown");
        assert_eq!(error.field, "operations[2]");
        let default = Operations::default_for_keys();
        assert!(default.contains(Operation::Consume) && !default.contains(Operation::AdminRead));
        assert_eq!(default.iter().count(), 6);
    }
}
