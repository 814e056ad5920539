//! `.env.example`, checked against the configuration: every variable the binary reads,
//! commented out, with its default and what it is for.

use super::ConfigArgs;

/// The variables read outside the configuration's flags: the logger's and OpenTelemetry's.
const READ_ELSEWHERE: [(&str, &str, &str); 4] = [
    ("RUST_LOG", "info", "Log filter (tracing EnvFilter syntax)."),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "",
        "OpenTelemetry OTLP/HTTP endpoint; set it to export traces.",
    ),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "",
        "The same, for traces alone (wins over the one above).",
    ),
    (
        "OTEL_SERVICE_NAME",
        "quota-ledger",
        "The service name traces carry.",
    ),
];

/// The file as the configuration gives it.
fn expected() -> String {
    let mut text = String::from(
        "# quota-ledger's configuration: every variable it reads, with its default.\n\
         # Copy to .env and uncomment what you change. Generated from the code; a test\n\
         # fails when it drifts (QUOTA_WRITE_ENV_EXAMPLE=1 cargo test --lib env_example\n\
         # rewrites it).\n",
    );
    for arg in ConfigArgs::command().get_arguments() {
        let Some(name) = arg.get_env().and_then(|name| name.to_str()) else {
            continue;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let default = arg
            .get_default_values()
            .first()
            .and_then(|value| value.to_str())
            .unwrap_or_default();
        text.push_str(&format!("\n# {}\n#{name}={default}\n", one_line(&help)));
    }
    for (name, default, help) in READ_ELSEWHERE {
        text.push_str(&format!("\n# {help}\n#{name}={default}\n"));
    }
    text
}

/// `help` on one line.
fn one_line(help: &str) -> String {
    help.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_env_example_lists_every_variable_with_its_default() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.env.example");
    let expected = expected();
    let found = std::fs::read_to_string(path).unwrap_or_default();
    if found != expected && std::env::var_os("QUOTA_WRITE_ENV_EXAMPLE").is_some() {
        std::fs::write(path, &expected).expect("writing .env.example");
        return;
    }
    assert!(
        found == expected,
        ".env.example drifted from the configuration; rewrite it with \
         QUOTA_WRITE_ENV_EXAMPLE=1 cargo test --lib env_example"
    );
}

#[test]
fn the_variables_read_elsewhere_are_in_the_configuration_page_and_in_help() {
    let page = include_str!("../../docs/configuration.md");
    for (name, _, _) in READ_ELSEWHERE {
        assert!(
            page.contains(&format!("| `{name}` |")),
            "docs/configuration.md lists {name}"
        );
        assert!(
            super::READ_ELSEWHERE_HELP.contains(name),
            "--help names {name}"
        );
    }
}
