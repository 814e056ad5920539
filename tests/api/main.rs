//! Integration tests over real HTTP against real stores: one binary, many modules.

#![allow(clippy::unwrap_used, missing_docs)]

mod helpers;

mod admin;
mod concurrency;
mod errors;
mod http_semantics;
mod openapi;
mod outages;
mod quota;
