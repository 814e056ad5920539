//! quota-ledger: daily business limits (calendar periods in the subject's time zone,
//! rolling windows, token buckets) enforced atomically over HTTP.
//!
//! - [`domain`]: valid-by-construction types (ids, quantities, windows, policies).
//! - [`clock`], [`keys`]: the time source, and the one place keys are formatted;
//!   `logs`: warnings that may repeat per request, written at most once a second.
//! - [`engine`]: the decision (window math, plans, consumes, refunds, holds, the ledger
//!   drain) and the ports it needs: counter store, ledger store, ledger stream.
//! - [`counters`]: the counter-store adapters (in-process memory; Redis with one Lua
//!   script per decision).
//! - [`ledger`]: the SQL ledger adapter (Postgres or SQLite) and retention.
//! - [`policy`]: policy and API key persistence (Postgres or SQLite) and the cache
//!   refresher.
//! - `access`: who may do what: the admin token, client tokens and API keys.
//! - [`db`]: the database connection and its migrations.
//! - [`admission`]: how many requests are served at once, and which wait.
//! - [`api`]: the actix-web handlers, problem+json errors and the OpenAPI document;
//!   [`grpc`]: Envoy's rate limit service.
//! - [`metrics`]: Prometheus counters, histograms and gauges, recorded by the API;
//!   [`telemetry`]: traces.
//! - [`config`]: the settings, from the environment or flags; [`cli`]: the subcommands.
//! - [`startup`]: wiring, shared by the binary and the tests.
//!
//! `ARCHITECTURE.md` at the repository root maps the modules and their boundaries.

mod access;
pub mod admission;
pub mod api;
#[cfg(test)]
mod architecture;
pub mod cli;
pub mod clock;
pub mod config;
pub mod counters;
pub mod db;
pub mod domain;
pub mod engine;
pub mod grpc;
pub mod keys;
pub mod ledger;
mod logs;
pub mod metrics;
pub mod policy;
pub mod startup;
pub mod telemetry;
mod tls;
mod webhooks;
