//! The SQL ledger adapter: Postgres and SQLite implementations of the engine's
//! [`LedgerStore`](crate::engine::ledger::LedgerStore) port, and retention.
//!
//! With Redis, the consume script appends each entry to a Redis Stream in the same atomic
//! step as the charge; the engine's drain moves them into SQL in batches (insert, commit,
//! then acknowledge), so a crash at any point loses nothing and duplicates nothing (entry
//! ids are unique; inserts ignore conflicts). With the embedded counters, entries are
//! written to SQL directly by the engine's group-commit writer before the answer.

pub mod activity;
mod copy;
mod cursor;
pub mod instances;
pub mod partitions;
pub mod query;
pub mod retention;
mod rows;
pub(crate) mod snapshot;
pub mod sql;
pub mod upgrade;
