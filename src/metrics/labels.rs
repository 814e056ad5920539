//! The label sets of the registry's families, and how their values are spelled.
//!
//! Every label value comes from a closed set (an enum or a literal) or from configuration
//! (`action` and `policy`, bounded as the parent module explains); no field can hold a
//! subject.

use super::Endpoint;
use crate::domain::Mode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use std::fmt::{self, Write as _};

/// How a consume or check ended: the `result` label of `quota_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum RequestResult {
    Allowed,
    Denied,
    Degraded,
    UnknownAction,
    Invalid,
    Unavailable,
    Overloaded,
    BacklogFull,
    Error,
}

impl RequestResult {
    fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Degraded => "degraded",
            Self::UnknownAction => "unknown_action",
            Self::Invalid => "invalid",
            Self::Unavailable => "unavailable",
            Self::Overloaded => "overloaded",
            Self::BacklogFull => "backlog_full",
            Self::Error => "error",
        }
    }
}

/// A series of `quota_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) endpoint: Endpoint,
    /// A configured action, or [`super::UNKNOWN_ACTION`].
    pub(super) action: String,
    pub(super) result: RequestResult,
}

/// A series of `quota_decisions_total`: one policy's part of a decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    pub(super) endpoint: Endpoint,
    pub(super) action: String,
    /// The id of a policy the engine evaluated, so of a configured one.
    pub(super) policy: String,
    pub(super) mode: Mode,
    /// `allowed` or `denied` (by this policy alone; a shadow policy never denies the request).
    pub(super) outcome: &'static str,
}

/// A series of `quota_decision_duration_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EndpointLabels {
    pub(super) endpoint: Endpoint,
}

/// A series of `quota_store_errors_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StoreErrorLabels {
    /// Always `counter`: the only store whose failures are counted here.
    pub(super) store: &'static str,
    /// `unavailable`, `timeout` or `protocol`.
    pub(super) kind: &'static str,
}

/// The labels of `quota_auth_failures`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct AuthFailureLabels {
    /// `missing`, `unknown`, `expired`, `revoked` or `forbidden`.
    pub(super) reason: &'static str,
}

impl EncodeLabelValue for Endpoint {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        encoder.write_str(self.label())
    }
}

impl EncodeLabelValue for RequestResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        encoder.write_str(self.label())
    }
}

impl EncodeLabelValue for Mode {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}
