//! Rendering [`Metrics`] in the Prometheus text exposition format, version 0.0.4.
//!
//! Request and decision series appear once they have counted something; the fixed
//! series (latency, store errors, cache gauges, build info) are always present.

use super::{Endpoint, Metrics, RequestResult, BUCKETS, MODES, OUTCOMES};
use crate::engine::policies::PolicyCache;
use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

/// Text being written; writing to a `String` cannot fail, so results are ignored.
#[derive(Default)]
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.0.push_str(name);
        for (i, (key, label)) in labels.iter().enumerate() {
            self.0.push(if i == 0 { '{' } else { ',' });
            self.0.push_str(key);
            self.0.push_str("=\"");
            escape_into(&mut self.0, label);
            self.0.push('"');
        }
        if !labels.is_empty() {
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Metrics {
    /// Every metric, with the policy cache's gauges, as Prometheus text (0.0.4).
    pub fn render(&self, cache: &PolicyCache, live: &super::Live) -> String {
        let mut out = Text::default();
        self.render_series(&mut out);
        self.render_durations(&mut out);
        out.family(
            "quota_store_errors_total",
            "counter",
            "Counter-store failures: unavailable (unreachable), timeout (no answer in time) or protocol (unexpected answers).",
        );
        for (kind, counter) in [
            ("unavailable", &self.store_unavailable),
            ("timeout", &self.store_timeouts),
            ("protocol", &self.store_protocol),
        ] {
            let labels = [("store", "counter"), ("kind", kind)];
            out.sample("quota_store_errors_total", &labels, load(counter));
        }
        out.family(
            "quota_degraded_allows_total",
            "counter",
            "Consumes and checks allowed unchecked because the counter store was down (QUOTA_ON_STORE_ERROR=allow).",
        );
        out.sample(
            "quota_degraded_allows_total",
            &[],
            load(&self.degraded_allows),
        );
        render_cache(&mut out, cache);
        out.family(
            "quota_counter_store_circuit_open",
            "gauge",
            "1 while the counter store's circuit breaker fails calls without trying.",
        );
        out.sample(
            "quota_counter_store_circuit_open",
            &[],
            u64::from(live.circuit_open),
        );
        if let Some(backlog) = live.ledger_backlog {
            out.family(
                "quota_ledger_backlog_entries",
                "gauge",
                "Ledger entries waiting in the Redis streams to be moved into SQL.",
            );
            out.sample("quota_ledger_backlog_entries", &[], backlog);
        }
        out.family(
            "quota_build_info",
            "gauge",
            "Always 1; labelled with the version.",
        );
        let version = [("version", env!("CARGO_PKG_VERSION"))];
        out.sample("quota_build_info", &version, 1);
        out.0
    }

    fn render_series(&self, out: &mut Text) {
        let actions = self.actions.read().unwrap_or_else(PoisonError::into_inner);
        let mut sorted: Vec<_> = actions.iter().collect();
        sorted.sort_unstable_by_key(|(action, _)| action.as_str());
        out.family(
            "quota_requests_total",
            "counter",
            "Consume and check requests by endpoint, action and result.",
        );
        for (action, series) in &sorted {
            for endpoint in Endpoint::ALL {
                for result in RequestResult::ALL {
                    let count = load(&series.requests[endpoint as usize][result as usize]);
                    if count > 0 {
                        let labels = [
                            ("endpoint", endpoint.label()),
                            ("action", action.as_str()),
                            ("result", result.label()),
                        ];
                        out.sample("quota_requests_total", &labels, count);
                    }
                }
            }
        }
        out.family(
            "quota_decisions_total",
            "counter",
            "Per-policy outcomes of consume and check decisions (shadow policies over their limit count as denied).",
        );
        for (action, series) in &sorted {
            let mut policies: Vec<_> = series.policies.iter().collect();
            policies.sort_unstable_by_key(|(policy, _)| policy.as_str());
            for (policy, counts) in policies {
                for endpoint in Endpoint::ALL {
                    for (m, mode) in MODES.into_iter().enumerate() {
                        for (o, outcome) in OUTCOMES.into_iter().enumerate() {
                            let count = load(&counts[endpoint as usize][m][o]);
                            if count > 0 {
                                let labels = [
                                    ("endpoint", endpoint.label()),
                                    ("action", action.as_str()),
                                    ("policy", policy.as_str()),
                                    ("mode", mode),
                                    ("outcome", outcome),
                                ];
                                out.sample("quota_decisions_total", &labels, count);
                            }
                        }
                    }
                }
            }
        }
    }

    fn render_durations(&self, out: &mut Text) {
        let name = "quota_decision_duration_seconds";
        out.family(
            name,
            "histogram",
            "Time the engine took to answer a consume or check (every call, errors included).",
        );
        for endpoint in Endpoint::ALL {
            let histogram = &self.durations[endpoint as usize];
            let mut cumulative = 0;
            let les = BUCKETS.iter().map(|(_, le)| *le).chain(["+Inf"]);
            for (counter, le) in histogram.counts.iter().zip(les) {
                cumulative += load(counter);
                let labels = [("endpoint", endpoint.label()), ("le", le)];
                out.sample(&format!("{name}_bucket"), &labels, cumulative);
            }
            let labels = [("endpoint", endpoint.label())];
            let seconds = load(&histogram.sum_nanos) as f64 / 1e9;
            out.sample(&format!("{name}_sum"), &labels, seconds);
            out.sample(&format!("{name}_count"), &labels, cumulative);
        }
    }
}

fn render_cache(out: &mut Text, cache: &PolicyCache) {
    let (policies, overrides) = cache.sizes();
    out.family(
        "quota_policy_cache_policies",
        "gauge",
        "Policies in the in-process cache, enabled or not.",
    );
    out.sample("quota_policy_cache_policies", &[], policies);
    out.family(
        "quota_policy_cache_overrides",
        "gauge",
        "Per-subject overrides in the in-process cache.",
    );
    out.sample("quota_policy_cache_overrides", &[], overrides);
    if let Some(at) = cache.last_reload() {
        let name = "quota_policy_cache_last_reload_timestamp_seconds";
        out.family(
            name,
            "gauge",
            "When the policy cache was last rebuilt (Unix time).",
        );
        out.sample(name, &[], at.timestamp_millis() as f64 / 1e3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Action;
    use crate::engine::EngineError;
    use std::time::Duration;

    fn line<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Text::default();
        out.sample("m", &[("a", "x\"y\\z\nw")], 1);
        assert_eq!(out.0, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_the_count() {
        let metrics = Metrics::new();
        let unknown: Result<crate::engine::Decision, EngineError> = Err(
            EngineError::UnknownAction(Action::parse("action", "a").expect("valid action")),
        );
        for millis in [0, 3, 3, 700, 5_000] {
            let elapsed = Duration::from_millis(millis);
            metrics.observe(Endpoint::Check, "a", elapsed, unknown.as_ref());
        }
        let text = metrics.render(&PolicyCache::new(), &crate::metrics::Live::default());
        let bucket = |le: &str| {
            let series =
                format!("quota_decision_duration_seconds_bucket{{endpoint=\"check\",le=\"{le}\"}}");
            line(&text, &series).map(str::to_owned)
        };
        assert_eq!(bucket("0.0005").as_deref(), Some("1"));
        assert_eq!(bucket("0.0025").as_deref(), Some("1"));
        assert_eq!(bucket("0.005").as_deref(), Some("3"));
        assert_eq!(bucket("1").as_deref(), Some("4"));
        assert_eq!(bucket("+Inf").as_deref(), Some("5"));
        let count = "quota_decision_duration_seconds_count{endpoint=\"check\"}";
        assert_eq!(line(&text, count), Some("5"));
        let sum = "quota_decision_duration_seconds_sum{endpoint=\"check\"}";
        assert_eq!(line(&text, sum), Some("5.706"));
        let unknown = "quota_requests_total{endpoint=\"check\",action=\"(unknown)\",result=\"unknown_action\"}";
        assert_eq!(line(&text, unknown), Some("5"));
        assert!(
            !text.contains("action=\"a\""),
            "the raw action is never a label"
        );
    }
}
