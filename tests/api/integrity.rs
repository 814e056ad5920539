//! The ledger is the book of record on every path: a change whose entry cannot be
//! committed is answered 503 and leaves nothing behind, on the embedded default (memory
//! counters, SQLite or Postgres ledger), whatever the fault: the database refusing
//! writes, a full disk, the database stopped.

mod faults;
mod refusal;
