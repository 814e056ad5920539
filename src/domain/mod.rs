//! Pure domain types with their invariants: identifiers, quantities, windows, policies,
//! and the ledger's entries.
//!
//! Everything here is parsed once at the edge (the API or a store row) and is valid by
//! construction afterwards. Nothing in this module knows HTTP, SQL or Redis.

mod alerts;
mod budget;
mod error;
mod globs;
mod ids;
mod ledger;
mod policy;
mod quantity;
mod window;

pub use alerts::{level, Crossing, Thresholds, MAX_THRESHOLDS};
pub use budget::{Attributes, Budget, Match, Scope, ScopeKey, MAX_ATTRIBUTES, SUBJECT_KEY};
pub use error::{FieldError, FieldErrors};
pub use globs::{ActionGlob, ActionSet, MAX_GLOBS};
pub use ids::{Action, PolicyId, Subject};
pub use ledger::{
    BadId, ConsumptionId, CounterCharge, EntryId, EntryKind, HoldId, IdempotencyKey, KeptAnswer,
    LedgerEntry, PolicyAmount, Restore, TotalLine,
};
pub use policy::{Measure, Mode, Override, OverrideSpec, Policy, PolicySpec, Record};
pub use quantity::{Quantity, MAX_SAFE};
pub use window::{Anchors, AnchorsInput, CalendarPeriod, Window, MAX_BUCKETS, MAX_WINDOW_SECONDS};
