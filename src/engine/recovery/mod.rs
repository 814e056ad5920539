//! Recovery: the counters are a cache of the ledger, the book of record, and are rebuilt
//! from it ([`rebuild`]): at each start in process, from the last [`snapshot`] on; per
//! shard on Redis, when one lost its epoch ([`shards`]), from the last [`checkpoint`] on. [`verify`] compares the live
//! counters with the ledger (on Redis at one instant of every shard, [`cut`]). [`void`]
//! gives back what Redis applied of an attempt answered 503.

pub(crate) mod backtest;
pub(crate) mod checkpoint;
pub(crate) mod cut;
mod pages;
pub(crate) mod rebuild;
pub mod shards;
pub(crate) mod snapshot;
pub(crate) mod verify;
pub mod void;
