//! Windows: `unit_multiplier` and `calendar`, and the errors that name a bad one.

use super::*;

#[test]
fn unit_multiplier_makes_windows_of_n_units() {
    let c = load(&one_limit(
        "unit: minute\nunit_multiplier: 5\nrequests_per_unit: 3",
    ));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert_eq!((l.unit_multiplier, l.window_secs()), (5, 300));
    assert_eq!(l.window_text(), "5 minute");
    assert!(
        c.describe()[0].ends_with("unit_multiplier=5"),
        "{:?}",
        c.describe()
    );
    // Left out, a window is one unit.
    let c = load(&one_limit("unit: hour\nrequests_per_unit: 3"));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert_eq!((l.unit_multiplier, l.calendar), (1, None));
}

#[test]
fn unit_multiplier_zero_is_an_error() {
    let e = load_err(&one_limit(
        "unit: minute\nunit_multiplier: 0\nrequests_per_unit: 3",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.unit_multiplier"),
        "unit_multiplier must be at least 1",
    );
    let e = load_err(&one_limit(
        "unit: year\nunit_multiplier: 20000\nrequests_per_unit: 3",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.unit_multiplier"),
        "10000 years",
    );
}

#[test]
fn calendar_loads_on_days_weeks_months_and_years() {
    for unit in ["day", "week", "month", "year"] {
        let c = load(&one_limit(&format!(
            "unit: {unit}\ncalendar: Europe/Berlin\nrequests_per_unit: 3"
        )));
        let l = only_limit(&c, "d", &[("k", "v")]);
        assert_eq!(
            l.calendar.map(|c| c.zone().to_owned()).as_deref(),
            Some("Europe/Berlin")
        );
        assert!(c.describe()[0].ends_with("calendar=Europe/Berlin"));
    }
    let c = load(&one_limit(
        "unit: month\nunit_multiplier: 3\ncalendar: UTC\nrequests_per_unit: 3\nalgorithm: sliding_window",
    ));
    assert_eq!(
        only_limit(&c, "d", &[("k", "v")]).window_text(),
        "3 month in UTC"
    );
}

#[test]
fn bad_calendars_are_errors_naming_the_problem() {
    let cases = [
        (
            "unit: day\ncalendar: Europe/Berlinn",
            "unknown time zone \"Europe/Berlinn\"",
        ),
        (
            "unit: hour\ncalendar: UTC",
            "calendar applies to day, week, month and year limits, not hour",
        ),
        ("unit: minute\ncalendar: UTC", "not minute"),
        (
            "unit: month\nunit_multiplier: 5\ncalendar: UTC",
            "unit_multiplier must divide 12",
        ),
        (
            "unit: day\ncalendar: UTC\nalgorithm: token_bucket",
            "a token bucket has no windows",
        ),
    ];
    for (body, needle) in cases {
        let e = load_err(&one_limit(&format!("{body}\nrequests_per_unit: 3")));
        assert_err(&e, "conf/a.yaml", &format!("{RL}.calendar"), needle);
    }
}

#[test]
fn windows_on_an_unlimited_limit_are_errors() {
    for field in ["unit_multiplier: 2", "calendar: UTC"] {
        let e = load_err(&one_limit(&format!("unlimited: true\n{field}")));
        let name = field.split(':').next().unwrap();
        assert_err(&e, "conf/a.yaml", &format!("{RL}.{name}"), "unlimited");
    }
}
