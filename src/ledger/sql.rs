//! The SQL ledger store (Postgres and SQLite).
