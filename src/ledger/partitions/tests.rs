use super::*;

#[test]
fn partitions_are_named_after_their_days() {
    let day = NaiveDate::from_ymd_opt(2026, 11, 28).expect("a date");
    for part in [Part::Day(day), Part::Before(day)] {
        assert_eq!(Part::parse(&part.name()), Some(part));
    }
    assert_eq!(Part::Day(day).name(), "ledger_entries_p20261128");
    assert_eq!(
        Part::Day(day).end(),
        NaiveDate::from_ymd_opt(2026, 11, 29).expect("a date")
    );
    assert_eq!(Part::Before(day).end(), day);
    assert_eq!(Part::parse("ledger_entries_pkey"), None);
    assert_eq!(Part::parse("ledger_entries_before_seq_at"), None);
    assert_eq!(midnight(day), "'2026-11-28T00:00:00Z'");
}
