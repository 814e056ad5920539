//! The counter-store adapters: implementations of the engine's
//! [`CounterStore`](crate::engine::store::CounterStore) port.
//!
//! - [`memory`]: in-process counters, the embedded default (sharded mutexes, the same
//!   arithmetic as the Lua scripts, in Rust).
//! - [`redis`]: Redis or Redis Cluster, one `EVALSHA` per decision; it also implements the
//!   [`LedgerStream`](crate::engine::pipeline::stream::LedgerStream) port.
//!
//! One conformance suite (`conformance`, tests only) runs the same scenarios on both.

pub(crate) mod circuit;
#[cfg(test)]
mod conformance;
pub mod memory;
pub mod redis;
