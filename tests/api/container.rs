//! compose.yaml and the Containerfile: the services compose.yaml runs, and every
//! variable they give the service is one it reads (a `#NAME=` line of .env.example).

use std::collections::BTreeSet;
use std::path::Path;

use yaml_serde::Value;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names of .env.example's `#NAME=…` lines: every variable the service reads.
fn read_by_service() -> BTreeSet<String> {
    let is_name = |n: &str| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    };
    read(".env.example")
        .lines()
        .filter_map(|line| line.strip_prefix('#')?.split_once('='))
        .map(|(name, _)| name)
        .filter(|name| is_name(name))
        .map(str::to_owned)
        .collect()
}

/// The services of compose.yaml whose `image` starts with `prefix`.
fn services_with_image<'a>(services: &'a Value, prefix: &str) -> Vec<&'a Value> {
    let map = services.as_mapping().expect("services: a mapping");
    map.values()
        .filter(|s| s["image"].as_str().is_some_and(|i| i.starts_with(prefix)))
        .collect()
}

/// A string or a sequence of strings (compose's `command`), as one string.
fn words(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Sequence(items) => items
            .iter()
            .map(|w| w.as_str().expect("a string").to_owned())
            .collect::<Vec<_>>()
            .join(" "),
        other => panic!("not a string nor a list: {other:?}"),
    }
}

#[test]
fn compose_runs_the_service_on_redis_with_aof_and_postgres() {
    let compose: Value = yaml_serde::from_str(&read("compose.yaml")).expect("compose.yaml: YAML");
    let services = &compose["services"];

    let quota = services_with_image(services, "quota-ledger");
    assert_eq!(quota.len(), 1, "one service with image quota-ledger");
    let quota = quota[0];
    assert!(
        quota.get("build").is_some(),
        "the quota-ledger service is built from the repo"
    );
    let redis = services_with_image(services, "redis");
    assert_eq!(redis.len(), 1, "one service with a redis image");
    assert_eq!(
        services_with_image(services, "postgres").len(),
        1,
        "one postgres service"
    );
    assert!(
        words(&redis[0]["command"]).contains("--appendonly yes"),
        "redis runs with --appendonly yes"
    );

    // `environment:` as a mapping, or as a list of NAME=VALUE.
    let given: Vec<String> = match &quota["environment"] {
        Value::Mapping(map) => map
            .keys()
            .map(|k| k.as_str().expect("a name").to_owned())
            .collect(),
        Value::Sequence(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .expect("NAME=VALUE")
                    .split('=')
                    .next()
                    .expect("NAME")
                    .to_owned()
            })
            .collect(),
        other => panic!("environment: neither a mapping nor a list: {other:?}"),
    };
    for name in [
        "QUOTA_LISTEN",
        "REDIS_URL",
        "DATABASE_URL",
        "QUOTA_ADMIN_TOKEN",
    ] {
        assert!(
            given.iter().any(|g| g == name),
            "compose.yaml gives the service no {name}"
        );
    }
    let known = read_by_service();
    for name in &given {
        assert!(
            known.contains(name),
            "compose.yaml sets {name}, which .env.example does not list"
        );
    }
}

#[test]
fn containerfile_sets_only_variables_the_service_reads() {
    let containerfile = read("Containerfile");
    // The runtime stage: after the last FROM.
    let runtime = containerfile
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("Containerfile: a runtime stage");
    let known = read_by_service();
    let mut names = Vec::new();
    for line in runtime.lines() {
        let Some(rest) = line.strip_prefix("ENV ") else {
            continue;
        };
        let tokens: Vec<&str> = rest.split_whitespace().collect();
        match tokens.first() {
            // ENV NAME=VALUE [NAME=VALUE…], or the older ENV NAME VALUE.
            Some(first) if first.contains('=') => {
                names.extend(
                    tokens
                        .iter()
                        .filter_map(|t| t.split_once('='))
                        .map(|(n, _)| n),
                );
            }
            Some(first) => names.push(first),
            None => panic!("an empty ENV line"),
        }
    }
    assert!(
        names.contains(&"QUOTA_LISTEN"),
        "the Containerfile sets QUOTA_LISTEN"
    );
    for name in names {
        assert!(
            known.contains(name),
            "the Containerfile sets {name}, which .env.example does not list"
        );
    }
}
