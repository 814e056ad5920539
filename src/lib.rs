//! quota-ledger: daily business limits (calendar periods in the subject's time zone,
//! rolling windows, token buckets) enforced atomically over HTTP.
//!
//! - [`domain`]: valid-by-construction types (ids, quantities, windows, policies).
//! - [`engine`]: the decision: window math, counter keys, and the counter stores
//!   (Redis with one Lua script per decision, or in-process memory).
//! - [`ledger`]: the durable record of every charge, refund and hold.
//! - [`policy`]: policy persistence (Postgres or SQLite) and the in-process cache.
//! - [`api`]: the actix-web handlers, problem+json errors and the OpenAPI document.
//! - [`metrics`]: Prometheus counters, histograms and gauges, recorded by the API.
//! - [`startup`]: wiring, shared by the binary and the tests.

pub mod api;
pub mod config;
pub mod db;
pub mod domain;
pub mod engine;
pub mod ledger;
pub mod metrics;
pub mod policy;
pub mod startup;
