//! Queued waiting (`queue:`), and `check`'s listing of every limit.

use super::*;

fn queue_limit(max_wait: &str) -> Result<Option<QueueSpec>, ConfigError> {
    let y = one_limit(&format!(
        "unit: second\nrequests_per_unit: 5\nqueue: {{max_waiting: 3, max_wait: {max_wait}}}"
    ));
    load_with(&[("conf/a.yaml", &y)], LoadOptions::default())
        .map(|c| only_limit(&c, "d", &[("k", "v")]).queue)
}

#[test]
fn queue_durations_parse() {
    for (text, d) in [
        ("800ms", Duration::from_millis(800)),
        ("2s", Duration::from_secs(2)),
        ("1.5s", Duration::from_millis(1500)),
        ("1m", Duration::from_secs(60)),
        ("1h", Duration::from_secs(3600)),
    ] {
        let q = queue_limit(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .expect("queue set");
        assert_eq!(
            q,
            QueueSpec {
                max_waiting: 3,
                max_wait: d
            },
            "{text}"
        );
    }
}

#[test]
fn queue_bad_durations_are_errors() {
    for (text, needle) in [
        ("0ms", "more than 0"),
        ("0s", "more than 0"),
        ("soon", "invalid duration"),
        ("5x", "unit must be"),
        ("5", "unit must be"),
        ("\"\"", "invalid duration"),
        ("-1s", "invalid duration"),
        ("25h", "out of range"),
    ] {
        let e = queue_limit(text).expect_err(text);
        assert_err(&e, "conf/a.yaml", &format!("{RL}.queue.max_wait"), needle);
    }
}

#[test]
fn queue_max_wait_garbage_says_invalid_duration() {
    let e = queue_limit("soon").unwrap_err();
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_wait"),
        "invalid duration",
    );
}

#[test]
fn queue_missing_or_zero_fields_are_errors() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_waiting"),
        "required",
    );
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_waiting: 0, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_waiting"),
        "at least 1",
    );
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 5\nqueue: {max_waiting: 2}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue.max_wait"),
        "required",
    );
}

#[test]
fn queue_on_zero_requests_per_unit_is_an_error() {
    let e = load_err(&one_limit(
        "unit: second\nrequests_per_unit: 0\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue"),
        "requests_per_unit: 0",
    );
    let e = load_err(&one_limit(
        "unit: second\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(
        &e,
        "conf/a.yaml",
        &format!("{RL}.queue"),
        "requests_per_unit: 0",
    );
}

#[test]
fn queue_with_unlimited_is_an_error() {
    let e = load_err(&one_limit(
        "unlimited: true\nqueue: {max_waiting: 2, max_wait: 1s}",
    ));
    assert_err(&e, "conf/a.yaml", &format!("{RL}.queue"), "unlimited");
}

// ------------------------------------------------------------------------------------------
// describe()

#[test]
fn describe_lists_every_limit_one_per_line() {
    let a = "domain: b_domain
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: inner
        rate_limit: {unit: hour, requests_per_unit: 2, name: inner_limit}
  - key: free
    rate_limit: {unlimited: true}
  - key: white
    value: listed
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 9}
      - {unit: day, requests_per_unit: 4, queue: {max_waiting: 5, max_wait: 250ms}}
";
    let b = "domain: a_domain
descriptors:
  - key: x
    rate_limit: {unit: Minute, requests_per_unit: 5}
";
    let c = load_with(&[("a.yaml", a), ("b.yaml", b)], LoadOptions::default()).expect("load");
    let lines = c.describe();
    assert_eq!(lines.len(), 6, "one line per limit: {lines:#?}");
    assert!(lines.iter().all(|l| !l.contains('\n')));
    let expect: [(&str, &[&str]); 6] = [
        ("a_domain.x: ", &["MINUTE", "requests_per_unit=5"]),
        ("b_domain.k_v: ", &["SECOND", "requests_per_unit=1"]),
        (
            "b_domain.k_v.inner: ",
            &["HOUR", "requests_per_unit=2", "inner_limit"],
        ),
        ("b_domain.free: ", &["unlimited"]),
        (
            "b_domain.multi: ",
            &["SECOND", "requests_per_unit=3", "token_bucket", "burst=9"],
        ),
        (
            "b_domain.multi: ",
            &["DAY", "requests_per_unit=4", "max_waiting=5", "250ms"],
        ),
    ];
    for (prefix, parts) in expect {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(prefix) && parts.iter().all(|p| l.contains(p))),
            "no line {prefix}{parts:?} in {lines:#?}"
        );
    }
    // Sorted by domain: a_domain first.
    assert!(lines[0].starts_with("a_domain."), "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("white")),
        "whitelist has no limit: {lines:#?}"
    );
}

// ------------------------------------------------------------------------------------------
// Config::load from disk.
