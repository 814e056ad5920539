//! Who may do what: the admin token, client tokens and API keys, and the one decision
//! every request goes through ([`Gate::admit`]) before it touches anything.
//!
//! - **Tokens** (`QUOTA_ADMIN_TOKEN`, `QUOTA_CLIENT_TOKENS`) are full-access and compared
//!   in constant time.
//! - **API keys** are data (`api_keys`, through the policy store): a name, action globs,
//!   operations and an optional expiry. Only a key's SHA-256 is stored; [`KeyRing`] holds
//!   every key in memory by that hash, so authorizing a request is one hash and one map
//!   lookup, never a database call. The ring is reloaded with the policies, by the same
//!   announcement and polling, so a revocation reaches every instance as a policy does.
//!
//! This module knows neither HTTP nor SQL: the API and the gRPC service map its answers.

mod gate;
mod key;
mod ring;

pub(crate) use gate::{Denial, Failure, Gate};
pub(crate) use key::{new_secret, KeyRecord, Operation, Operations};
pub(crate) use ring::{Grant, KeyRing};
