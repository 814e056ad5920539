//! Policies (a limit on an action) and per-subject overrides.

use super::{Action, Attributes, FieldError, Match, PolicyId, Quantity, Scope, Subject, Window};
use chrono::{DateTime, Utc};

/// What one consume charges against a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Measure {
    /// 1 per consume.
    Count,
    /// The request's `amount`, in minor units.
    Amount,
}

impl Measure {
    /// Parses the wire name.
    pub(crate) fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        match value {
            "count" => Ok(Self::Count),
            "amount" => Ok(Self::Amount),
            _ => Err(FieldError::new(field, "must be 'count' or 'amount'")),
        }
    }

    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Amount => "amount",
        }
    }

    /// The units a consume of `amount` charges under this measure.
    pub(crate) fn cost(self, amount: Quantity) -> Quantity {
        match self {
            Self::Count => Quantity::saturating(1),
            Self::Amount => amount,
        }
    }
}

/// Whether a policy may deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Denies when over the limit.
    #[default]
    Enforce,
    /// Counts and reports, never denies: for trying a limit out.
    Shadow,
}

impl Mode {
    /// Parses the wire name.
    pub(crate) fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        match value {
            "enforce" => Ok(Self::Enforce),
            "shadow" => Ok(Self::Shadow),
            _ => Err(FieldError::new(field, "must be 'enforce' or 'shadow'")),
        }
    }

    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
        }
    }
}

/// What the ledger keeps of a policy's consumes (`record` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Record {
    /// One ledger entry per consume: the book of record, request by request.
    #[default]
    Entries,
    /// The ledger's totals per budget and counter period (`ledger_totals`): a consume
    /// that charges only such policies and carries no idempotency key writes no entry.
    Totals,
}

impl Record {
    /// Parses the wire name.
    pub(crate) fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        match value {
            "entries" => Ok(Self::Entries),
            "totals" => Ok(Self::Totals),
            _ => Err(FieldError::new(field, "must be 'entries' or 'totals'")),
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Entries => "entries",
            Self::Totals => "totals",
        }
    }
}

/// The writable part of a policy, as an operator submits it; valid by construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// The action it limits.
    pub action: Action,
    /// What a consume charges.
    pub measure: Measure,
    /// A display label for the units, e.g. `USD cents`.
    pub unit: Option<String>,
    /// The most that may be used in one window.
    pub limit: Quantity,
    /// How usage is grouped in time.
    pub window: Window,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Disabled policies are ignored by consumes.
    pub enabled: bool,
    /// Whether denied attempts are recorded in the ledger too.
    pub ledger_denials: bool,
    /// Free text for operators.
    pub description: String,
    /// The keys whose values name one budget (default: one per subject).
    pub scope: Scope,
    /// When the policy applies (`match` on the wire); empty, always.
    pub conditions: Match,
    /// When it does not (`match_not` on the wire): it applies only to a request whose value
    /// of every key listed is none of its values; empty, always.
    pub exclusions: Match,
    /// The attribute naming the request's own time zone (`window.timezone_attribute`;
    /// calendar windows only): the period is computed in it, `window`'s zone otherwise.
    pub zone_attribute: Option<String>,
    /// The percents of the limit at which a budget's usage is reported
    /// (`alert_thresholds`); empty, none.
    pub alert_thresholds: super::Thresholds,
    /// What the ledger keeps of its consumes: entries (default) or totals.
    pub record: Record,
}

impl PolicySpec {
    /// Whether the policy applies to a request: its `match` admits it and its `match_not`
    /// does not exclude it.
    pub fn applies_to(&self, subject: &Subject, attributes: &Attributes) -> bool {
        self.conditions.admits(subject, attributes) && self.exclusions.excludes(subject, attributes)
    }

    /// Whether switching from `self` to `next` keeps the counted usage.
    ///
    /// Usage is kept when only the limit, mode, description, switches, `match` or
    /// `match_not` change; a
    /// new window, measure, scope or zone attribute starts counting afresh (counter keys
    /// include them).
    pub(crate) fn keeps_usage_of(&self, next: &PolicySpec) -> bool {
        self.window == next.window
            && self.measure == next.measure
            && self.scope == next.scope
            && self.zone_attribute == next.zone_attribute
    }
}

impl PolicySpec {
    /// An enforced, enabled policy of `limit` (saturated to 2^53 - 1) on `action` in
    /// `window`, every other field at its default: what the unit tests, the benches and the
    /// bench's bulk loader start from. Panics if `action` is not a valid action.
    #[doc(hidden)]
    pub fn example(action: &str, measure: Measure, limit: u64, window: Window) -> Self {
        Self {
            action: Action::parse("action", action).expect("a valid action"),
            measure,
            unit: None,
            limit: Quantity::saturating(limit),
            window,
            mode: Mode::Enforce,
            enabled: true,
            ledger_denials: false,
            description: String::new(),
            scope: Scope::default(),
            conditions: Match::default(),
            exclusions: Match::default(),
            zone_attribute: None,
            alert_thresholds: super::Thresholds::default(),
            record: Record::Entries,
        }
    }
}

/// A stored policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Unique id.
    pub id: PolicyId,
    /// The operator-controlled fields.
    pub spec: PolicySpec,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Starts at 1, +1 on every change; the `ETag`.
    pub version: i64,
}

/// The writable part of an override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideSpec {
    /// The limit that replaces the policy's for this subject.
    pub(crate) limit: Quantity,
    /// When the override stops applying; `None` for never.
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Why it exists.
    pub(crate) note: Option<String>,
}

/// A per-subject limit replacing a policy's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The policy it belongs to.
    pub(crate) policy_id: PolicyId,
    /// The budget it applies to, as [`super::Budget::text`] names it: the subject, for
    /// the default scope.
    pub(crate) subject: Subject,
    /// The operator-controlled fields.
    pub(crate) spec: OverrideSpec,
    /// When it was created.
    pub(crate) created_at: DateTime<Utc>,
    /// When it last changed.
    pub(crate) updated_at: DateTime<Utc>,
}
