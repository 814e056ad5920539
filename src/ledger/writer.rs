//! Group-commit writer for the embedded default.
