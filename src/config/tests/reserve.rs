//! `reserve` and `reserve_for`: what each check holds, and the combinations refused.

use std::time::Duration;

use super::*;
use crate::config::Reserve;

const DAY: &str = "unit: day\nrequests_per_unit: 1000";

#[test]
fn reserve_loads_on_every_algorithm_with_its_hold() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket"] {
        let c = load(&one_limit(&format!(
            "{DAY}\nalgorithm: {algorithm}\nreserve: 300\nreserve_for: 90s"
        )));
        let l = only_limit(&c, "d", &[("k", "v")]);
        assert_eq!(
            l.reserve,
            Some(Reserve {
                hits: 300,
                hold: Duration::from_secs(90)
            }),
            "{algorithm}"
        );
    }
    let c = load(&one_limit(&format!(
        "{DAY}\nreserve: 300\nreserve_for: 90s"
    )));
    assert!(
        c.describe()
            .iter()
            .any(|l| l.ends_with("reserve=300 reserve_for=90000ms")),
        "{:?}",
        c.describe()
    );
    let c = load(&one_limit(&format!(
        "{DAY}\nalgorithm: token_bucket\nburst: 300\nreserve: 300"
    )));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert_eq!(l.reserve.map(|r| r.hits), Some(300), "reserve at the burst");
    let c = load(&one_limit(&format!("{DAY}\nreserve: 1")));
    let l = only_limit(&c, "d", &[("k", "v")]);
    assert_eq!(l.reserve.map(|r| r.hold), Some(Reserve::DEFAULT_HOLD));
    let c = load(&one_limit(DAY));
    assert_eq!(only_limit(&c, "d", &[("k", "v")]).reserve, None);
}

#[test]
fn reserves_that_cannot_work_are_refused_naming_the_field() {
    let cases = [
        ("reserve: 0", "reserve", "at least 1"),
        ("reserve: 1001", "reserve", "more than the limit's 1000"),
        ("reserve_for: 1m", "reserve_for", "needs reserve"),
        (
            "reserve: 10\nreserve_for: 0s",
            "reserve_for",
            "at least 1ms",
        ),
        (
            "reserve: 10\nreserve_for: 25h",
            "reserve_for",
            "out of range",
        ),
        ("reserve: 10\nreserve_for: soon", "reserve_for", "soon"),
        ("reserve: 10\nlocal_first: true", "reserve", "local_first"),
        // A token bucket admits at most its burst at once, whatever requests_per_unit says.
        (
            "algorithm: token_bucket\nburst: 299\nreserve: 300",
            "reserve",
            "more than the token bucket's burst 299",
        ),
        (
            "reserve: 10\nqueue: {max_waiting: 2, max_wait: 1s}",
            "reserve",
            "queue",
        ),
    ];
    for (extra, field, says) in cases {
        let e = load_err(&one_limit(&format!("{DAY}\n{extra}")));
        assert_err(&e, "conf/a.yaml", &format!("{RL}.{field}"), says);
    }
    let e = load_err(&one_limit("unlimited: true\nreserve: 10"));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.reserve"), "unlimited");
}
