//! From prometheus-client's OpenMetrics text to the Prometheus text format 0.0.4 that
//! `/metrics` serves (its `Content-Type` and OpenAPI entry say 0.0.4).
//!
//! The two formats differ, for what we expose, in one place: OpenMetrics names a counter
//! family without its `_total` suffix (`# TYPE quota_requests counter`, then samples
//! `quota_requests_total{..}`), while 0.0.4 names the family after its samples
//! (`# TYPE quota_requests_total counter`). A 0.0.4 parser would otherwise see the samples
//! as untyped. Samples, gauges and histograms are the same in both, and the `# EOF` line
//! is never written (we encode with `encode_registry`, not `encode`).

/// `open_metrics` (as `prometheus_client::encoding::text::encode_registry` writes it)
/// with the `# HELP` and `# TYPE` lines of every counter family renamed to `<name>_total`.
///
/// The encoder writes each family's `# HELP` line directly before its `# TYPE` line, and
/// escapes line feeds in label values, so every line seen here is whole.
pub(super) fn prometheus_0_0_4(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len() + 64);
    let mut lines = open_metrics.lines().peekable();
    while let Some(line) = lines.next() {
        let counter = line.strip_prefix("# HELP ").and_then(|rest| {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let next = lines.peek()?.strip_prefix("# TYPE ")?;
            (next.strip_suffix(" counter")? == name).then_some((name, help))
        });
        match counter {
            Some((name, help)) => {
                lines.next();
                out.push_str(&format!(
                    "# HELP {name}_total {help}\n# TYPE {name}_total counter\n"
                ));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::prometheus_0_0_4;

    #[test]
    fn counter_families_are_named_after_their_samples_and_nothing_else_changes() {
        // Only the counter's HELP and TYPE lines differ between the two texts.
        let rest = concat!(
            "quota_x_total{a=\"# TYPE quota_x counter\"} 1\n",
            "# HELP quota_y Ys.\n",
            "# TYPE quota_y gauge\n",
            "quota_y 2\n",
            "# HELP quota_z_seconds Zs.\n",
            "# TYPE quota_z_seconds histogram\n",
            "quota_z_seconds_sum 0.5\n",
        );
        let open_metrics = format!("# HELP quota_x Xs.\n# TYPE quota_x counter\n{rest}");
        let expected = format!("# HELP quota_x_total Xs.\n# TYPE quota_x_total counter\n{rest}");
        assert_eq!(prometheus_0_0_4(&open_metrics), expected);
    }

    #[test]
    fn a_type_line_of_another_family_does_not_rename_a_help_line() {
        let text = "# HELP quota_a A.\n# TYPE quota_ab counter\nquota_ab_total 1\n";
        assert_eq!(prometheus_0_0_4(text), text);
    }
}
