use super::*;
use serde_json::json;

/// The example policy file, with server-set fields added to its last entry (as an export
/// would carry them).
fn file() -> String {
    format!(
        "{}    version: 7\n    created_at: \"2026-01-01T00:00:00Z\"\n",
        include_str!("../../../examples/policies.yaml")
    )
}

#[test]
fn a_file_is_read_in_canonical_form_with_server_set_fields_ignored() {
    let policies = read_file(&file()).expect("a valid file");
    assert_eq!(policies.len(), 2);
    let sms = &policies["sms-per-day"];
    assert_eq!(sms["mode"], "enforce", "defaults filled in");
    assert_eq!(sms["enabled"], true);
    assert_eq!(sms["description"], "");
    assert_eq!(sms["window"]["timezone"], "America/New_York");
    let transfer = &policies["transfer-usd-24h"];
    assert!(transfer.get("version").is_none() && transfer.get("created_at").is_none());
    // The same policies written as JSON read the same.
    let json = serde_json::to_string(&json!({"policies": policies.values().collect::<Vec<_>>()}))
        .expect("JSON");
    assert_eq!(read_file(&json).expect("JSON is read too"), policies);
}

#[test]
fn every_invalid_entry_is_named_with_its_field() {
    let file = r#"
policies:
  - {id: ok, action: a, measure: count, limit: 1, window: {type: calendar, period: day}}
  - {id: bad-limit, action: a, measure: count, limit: -1, window: {type: calendar, period: day}}
  - {id: bad-zone, action: a, measure: count, limit: 1, window: {type: calendar, period: day, timezone: Mars/Base}}
  - {id: typo, action: a, measure: count, limit: 1, windw: {}}
  - {action: a, measure: count, limit: 1, window: {type: calendar, period: day}}
  - {id: ok, action: b, measure: count, limit: 2, window: {type: calendar, period: day}}
"#;
    let problems = read_file(file).expect_err("invalid");
    let text = problems.join("\n");
    for expected in [
        "policies[1] (id bad-limit): field `limit`",
        "policies[2] (id bad-zone): field `window.timezone`",
        "policies[3] (id typo):",
        "policies[4]: field `id`: is required",
        "policies[5] (id ok): field `id`: `ok` appears twice",
    ] {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
    assert!(!text.contains("policies[0]"), "{text}");
}

#[test]
fn a_file_that_is_not_a_policy_file_is_refused() {
    for (file, expected) in [
        ("- a\n- b\n", "must be an object"),
        ("policies: 3\n", "must be a list"),
        (
            "policies: []\nrules: []\n",
            "unknown top-level field `rules`",
        ),
        ("policies: [\n", "not YAML or JSON"),
    ] {
        let problems = read_file(file).expect_err(file);
        assert!(
            problems.join("\n").contains(expected),
            "{file}: {problems:?}"
        );
    }
    assert_eq!(read_file("policies: []\n").expect("empty"), BTreeMap::new());
}

#[test]
fn a_plan_describes_each_change_and_what_it_keeps() {
    let plan = Plan {
        changes: vec![
            Change::Create {
                id: "a".into(),
                body: json!({}),
            },
            Change::Update {
                id: "b".into(),
                version: 3,
                body: json!({}),
                fields: vec![("limit".into(), "10".into(), "20".into())],
            },
            Change::Delete {
                id: "c".into(),
                version: 1,
            },
        ],
        kept: vec!["d".into()],
    };
    let text = plan.describe();
    for line in [
        "+ a: create",
        "~ b: update",
        "    limit: 10 -> 20",
        "- c: delete",
        "--prune deletes them): d",
        "1 to create, 1 to update, 1 to delete",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    assert_eq!(
        differences(
            &json!({"limit": 10, "mode": "enforce"}),
            &json!({"limit": 20, "mode": "enforce"})
        ),
        vec![("limit".to_owned(), "10".to_owned(), "20".to_owned())]
    );
}

#[test]
fn an_exported_policy_lists_its_id_first_and_its_fields_in_the_apis_order() {
    let policies = read_file(&file()).expect("a valid file");
    let yaml = yaml_serde::to_string(&in_field_order(&policies["sms-per-day"])).expect("YAML");
    let keys: Vec<&str> = yaml
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('-'))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(keys, FIELD_ORDER, "{yaml}");
    assert!(yaml.contains("window:\n  type: calendar\n"), "{yaml}");
}
