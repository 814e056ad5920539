use super::*;

fn subject(text: &str) -> Subject {
    Subject::parse("subject", text).expect("a valid subject")
}

fn attributes(pairs: &[(&str, &str)]) -> Attributes {
    Attributes::parse(
        "attributes",
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
    .expect("valid attributes")
}

fn fields(errors: FieldErrors) -> Vec<String> {
    errors.0.into_iter().map(|e| e.field).collect()
}

#[test]
fn attributes_take_16_keys_of_the_key_charset_with_printable_values() {
    let many: Vec<(String, String)> = (0..16).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(Attributes::parse("attributes", many).is_ok());
    let long_key = "a".repeat(32);
    assert!(Attributes::parse("attributes", [(long_key, "é".repeat(128))]).is_ok());
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("Country", "NG")], "attributes"),
        (&[("1x", "NG")], "attributes"),
        (&[("", "NG")], "attributes"),
        (&[("country", "")], "attributes.country"),
        (&[("country", "a\tb")], "attributes.country"),
        (&[("subject", "u-1")], "attributes.subject"),
    ];
    for (pairs, field) in cases {
        let owned = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        let errors = Attributes::parse("attributes", owned).expect_err("refused");
        assert_eq!(fields(errors), [*field], "{pairs:?}");
    }
    let too_many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    assert_eq!(
        fields(Attributes::parse("attributes", too_many).expect_err("17")),
        ["attributes"]
    );
    let too_long = Attributes::parse("attributes", [("a".repeat(33), "v".to_owned())]);
    assert!(too_long.is_err());
    let value = Attributes::parse("attributes", [("k".to_owned(), "é".repeat(129))]);
    assert!(value.is_err());
}

#[test]
fn a_scope_has_at_most_four_distinct_keys_and_defaults_to_the_subject() {
    assert!(Scope::default().is_default());
    assert!(Scope::parse::<&str>("scope", &[]).is_ok());
    let org_country = Scope::parse("scope", &["org", "country"]).expect("valid");
    assert!(!org_country.is_default() && !org_country.has_subject());
    assert_eq!(org_country.names(), "org,country");
    assert_eq!(Scope::from_names("org,country").ok(), Some(org_country));
    assert_eq!(
        Scope::from_names("").ok(),
        Scope::parse::<&str>("scope", &[]).ok()
    );
    let cases: &[(&[&str], &[&str])] = &[
        (&["a", "b", "c", "d", "e"], &["scope"]),
        (&["country", "country"], &["scope[1]"]),
        (&["subject", "Bad"], &["scope[1]"]),
    ];
    for (keys, expected) in cases {
        let errors = Scope::parse("scope", keys).expect_err("refused");
        assert_eq!(fields(errors), *expected, "{keys:?}");
    }
}

#[test]
fn a_budget_is_the_values_of_the_scope_and_a_missing_attribute_is_named() {
    let scope = Scope::parse("scope", &["org", "subject"]).expect("valid");
    let budget = scope
        .budget(
            "p",
            &subject("u-1"),
            &attributes(&[("org", "acme"), ("x", "y")]),
        )
        .expect("complete");
    let pairs: Vec<_> = budget.iter().collect();
    assert_eq!(pairs, [("org", "acme"), ("subject", "u-1")]);
    let missing = scope
        .budget("p", &subject("u-1"), &attributes(&[]))
        .expect_err("org is missing");
    assert_eq!(missing.field, "attributes.org");
    assert!(
        missing.message.contains("policy 'p'"),
        "{}",
        missing.message
    );
    let global = Scope::parse::<&str>("scope", &[]).expect("valid");
    let whole = global
        .budget("p", &subject("u"), &attributes(&[]))
        .expect("global");
    assert_eq!(whole.iter().count(), 0);
    assert!(Budget::of_subject(&subject("u")).is_subject_only());
}

#[test]
fn budget_texts_read_back_against_their_scope() {
    /// A scope's keys, the request's attributes, and the budget's text.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["subject"], &[], "u,1"),
        (&["country"], &[("country", "NG")], "NG"),
        (&[], &[], "*"),
        (
            &["org", "country"],
            &[("org", "a,b%c"), ("country", "NG")],
            "a%2Cb%25c,NG",
        ),
    ];
    for (keys, attrs, text) in cases {
        let scope = Scope::parse("scope", keys).expect("valid");
        let budget = scope
            .budget("p", &subject("u,1"), &attributes(attrs))
            .expect("complete");
        assert_eq!(budget.text(), *text);
        assert_eq!(Budget::from_text("budget", &scope, text), Ok(budget));
    }
    let two = Scope::parse("scope", &["org", "country"]).expect("valid");
    for bad in ["acme", "a,b,c", "a%zz,b", "a,"] {
        assert!(Budget::from_text("budget", &two, bad).is_err(), "{bad}");
    }
    let global = Scope::parse::<&str>("scope", &[]).expect("valid");
    assert!(Budget::from_text("budget", &global, "NG").is_err());
}

#[test]
fn a_match_applies_only_when_every_key_lists_the_request_value() {
    let condition = Match::parse(
        "match",
        [
            (
                "plan".to_owned(),
                vec!["free".to_owned(), "trial".to_owned()],
            ),
            (
                "subject".to_owned(),
                vec!["u-1".to_owned(), "u-2".to_owned()],
            ),
        ],
    )
    .expect("valid");
    let free = attributes(&[("plan", "free")]);
    assert!(condition.admits(&subject("u-1"), &free));
    assert!(
        !condition.admits(&subject("u-3"), &free),
        "subject not listed"
    );
    let paid = attributes(&[("plan", "paid")]);
    assert!(
        !condition.admits(&subject("u-1"), &paid),
        "value not listed"
    );
    assert!(
        !condition.admits(&subject("u-1"), &attributes(&[])),
        "key missing"
    );
    assert!(Match::default().admits(&subject("u"), &attributes(&[])));
    /// A `match` as the wire gives it.
    type Entries = Vec<(String, Vec<String>)>;
    let cases: Vec<(Entries, &str)> = vec![
        (vec![("plan".into(), vec![])], "match.plan"),
        (vec![("plan".into(), vec!["v".into(); 65])], "match.plan"),
        (vec![("Plan".into(), vec!["v".into()])], "match.Plan"),
        (vec![("plan".into(), vec!["".into()])], "match.plan[0]"),
    ];
    for (entries, field) in cases {
        let errors = Match::parse("match", entries.clone()).expect_err("refused");
        assert_eq!(fields(errors), [field], "{entries:?}");
    }
}
