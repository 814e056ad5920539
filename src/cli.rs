//! Commands that talk to a running service over its HTTP API (the top layer, beside
//! `startup`): `policies export | diff [--backtest DAYS] | apply`, `counters verify`, `keys create | list |
//! revoke`, `webhooks …`.

pub mod backtest;
pub mod counters;
pub mod keys;
pub mod policies;
pub mod webhooks;
