//! Integration tests over real HTTP against real stores: one binary, many modules.

#![expect(clippy::unwrap_used, reason = "a test that cannot unwrap has failed")]
#![expect(
    clippy::too_many_lines,
    reason = "a scenario reads top to bottom, one step after another"
)]

mod helpers;

mod admin;
mod alerts;
mod backlog;
mod backtest;
mod budgets;
mod clock;
mod concurrency;
mod console;
mod container;
mod crash;
mod docs;
mod envoy;
mod errors;
mod flamegraph;
mod http_semantics;
mod integrity;
mod keys;
mod ledger;
mod mixed_version;
mod observability;
mod older_redis;
mod openapi;
mod outages;
mod overload;
mod payments;
mod policies_file;
mod propagation;
mod quota;
mod record_levels;
mod redis_loss;
mod redis_settings;
mod replicas;
mod restarts;
mod sentinel;
mod shutdown;
mod tls;
mod traces;
mod velocity;
mod webhooks;
