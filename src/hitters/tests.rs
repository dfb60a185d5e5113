use super::*;
use crate::config::LoadOptions;

fn config(yaml: &str) -> Config {
    Config::from_sources(&[("t.yaml".into(), yaml.into())], LoadOptions::default()).unwrap()
}

const YAML: &str = "
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
";

fn node<'c>(c: &'c Config, stat_key: &str) -> &'c Node {
    let mut found = None;
    c.for_each_node(&mut |n| {
        if *n.stat_key == *stat_key {
            found = Some(n);
        }
    });
    found.unwrap_or_else(|| panic!("no node {stat_key}"))
}

fn e<'a>(key: &'a str, value: &'a str) -> Entry<'a> {
    Entry { key, value }
}

fn ip(v: &str) -> Vec<Entry<'_>> {
    vec![e("remote_address", v)]
}

fn names(l: &[TopValue]) -> Vec<(&str, u64, u64)> {
    l.iter()
        .map(|v| (v.value.as_str(), v.hits, v.refused))
        .collect()
}

const T0: u64 = 1_800_000_000 * 1_000_000_000;
const SEC: u64 = 1_000_000_000;

#[test]
fn lists_rank_by_refused_and_by_hits_and_name_the_values() {
    let c = config(YAML);
    let table = TopTable::new(3).with_sample(1);
    table.tick(T0);
    let bound = table.bind(&c);
    let n = node(&c, "web.remote_address");
    for _ in 0..50 {
        bound.record(n, &ip("10.0.0.1"), 1, false, false);
    }
    for _ in 0..10 {
        bound.record(n, &ip("10.0.0.2"), 1, false, false);
    }
    for _ in 0..20 {
        bound.record(n, &ip("10.0.0.2"), 1, true, true);
    }
    bound.record(n, &ip("10.0.0.3"), 2, true, true);
    bound.record(n, &ip("10.0.0.4"), 0, true, true);
    let lists = bound.of(n).unwrap().lists(table.now_s(), 3);
    assert_eq!(
        names(&lists.by_refused),
        vec![
            ("remote_address=10.0.0.2", 30, 20),
            ("remote_address=10.0.0.3", 2, 2)
        ]
    );
    assert_eq!(
        names(&lists.by_hits),
        vec![
            ("remote_address=10.0.0.1", 50, 0),
            ("remote_address=10.0.0.2", 30, 20),
            ("remote_address=10.0.0.3", 2, 2),
        ]
    );
    let v = &lists.by_hits[0];
    assert_eq!((v.first_seen, v.last_seen), (T0 / SEC, T0 / SEC));
    let nested = node(&c, "web.path.user");
    bound.record(
        nested,
        &[e("path", "/a"), e("user", "bob")],
        1,
        false,
        false,
    );
    let l = bound.of(nested).unwrap().lists(table.now_s(), 3);
    assert_eq!(names(&l.by_hits), vec![("path=/a, user=bob", 1, 0)]);
    assert!(
        bound.of(node(&c, "web.path")).is_none(),
        "a node without limits has no lists"
    );
}

#[test]
fn lists_cover_the_current_window_and_the_previous_one() {
    let c = config(YAML);
    let table = TopTable::new(5).with_sample(1);
    let bound = table.bind(&c);
    let n = node(&c, "web.remote_address");
    let start = (T0 / SEC / WINDOW_SECS) * WINDOW_SECS * SEC;
    table.tick(start);
    bound.record(n, &ip("old"), 1, true, true);
    table.tick(start + WINDOW_SECS * SEC + 5 * SEC);
    bound.record(n, &ip("new"), 1, false, false);
    let top = bound.of(n).unwrap();
    let l = top.lists(table.now_s(), 5);
    assert_eq!(
        names(&l.by_hits),
        vec![("remote_address=old", 1, 1), ("remote_address=new", 1, 0)]
    );
    assert_eq!(l.by_hits[1].first_seen, start / SEC + WINDOW_SECS + 5);
    // A window later, `old` has aged out, even with no traffic to turn the windows over.
    table.tick(start + 2 * WINDOW_SECS * SEC);
    let l = top.lists(table.now_s(), 5);
    assert_eq!(names(&l.by_hits), vec![("remote_address=new", 1, 0)]);
    assert!(l.by_refused.is_empty());
    table.tick(start + 10 * WINDOW_SECS * SEC);
    assert_eq!(top.lists(table.now_s(), 5), TopLists::default());
}

#[test]
fn lists_survive_a_reload_by_stat_key_and_go_with_their_limit() {
    let table = TopTable::new(5).with_sample(1);
    table.tick(T0);
    let c1 = config(YAML);
    let b1 = table.bind(&c1);
    b1.record(node(&c1, "web.remote_address"), &ip("a"), 3, true, true);
    b1.record(
        node(&c1, "web.path.user"),
        &[e("path", "/"), e("user", "u")],
        1,
        false,
        false,
    );
    let c2 = config(
        "
domain: web
descriptors:
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
",
    );
    let b2 = table.bind(&c2);
    let kept = b2.of(node(&c2, "web.remote_address")).unwrap();
    assert_eq!(
        names(&kept.lists(table.now_s(), 5).by_refused),
        vec![("remote_address=a", 3, 3)]
    );
    table.drop_unbound();
    assert!(
        table.by_key.lock().unwrap().contains_key("web.path.user"),
        "the replaced config may still be read: its limits keep their lists"
    );
    drop(b1);
    table.drop_unbound();
    let by_key = table.by_key.lock().unwrap();
    assert!(
        !by_key.contains_key("web.path.user"),
        "once it is freed, the dropped limit's lists are gone"
    );
    assert_eq!(
        by_key.len(),
        1,
        "lists are made for limits a value was counted on"
    );
}

#[test]
fn tracking_off_binds_nothing() {
    let c = config(YAML);
    let table = TopTable::new(0);
    let bound = table.bind(&c);
    let n = node(&c, "web.remote_address");
    bound.record(n, &ip("a"), 1, true, true);
    assert!(bound.of(n).is_none());
}

/// A million distinct values through one limit: memory stays at the bound (every table at
/// its capacity), and a client sending one request in ten is on top of both lists.
#[test]
fn a_key_flood_stays_bounded_and_the_heavy_hitter_stays_on_top() {
    let c = config(YAML);
    let top_n = DEFAULT_TOP_N;
    let table = TopTable::new(top_n);
    table.tick(T0);
    let bound = table.bind(&c);
    let n = node(&c, "web.remote_address");
    let mut value = String::new();
    for i in 0..1_000_000u32 {
        use std::fmt::Write as _;
        value.clear();
        let _ = write!(value, "10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        bound.record(n, &ip(&value), 1, i % 3 == 0, i % 3 == 0);
        if i % 10 == 0 {
            bound.record(n, &ip("203.0.113.7"), 1, true, true);
        }
    }
    let top = bound.of(n).unwrap();
    // Two windows × two tables × every stripe, each of 2 × top_n slots.
    let most = 2 * 2 * STRIPES * sketch::SpaceSaving::max_bytes(2 * top_n);
    assert!(
        top.allocated_bytes() <= most,
        "{} > {most}",
        top.allocated_bytes()
    );
    assert!(
        most < 1 << 20,
        "a limit holds under a MiB at the default: {most}"
    );
    let lists = top.lists(table.now_s(), top_n);
    assert_eq!(lists.by_hits[0].value, "remote_address=203.0.113.7");
    assert_eq!(lists.by_refused[0].value, "remote_address=203.0.113.7");
    assert!(lists.by_hits[0].hits - lists.by_hits[0].hits_error <= 100_000);
    assert!(lists.by_hits[0].hits >= 100_000);
    assert_eq!(lists.by_hits.len(), top_n);
}

#[test]
fn admitted_hits_are_sampled_and_refusals_are_not() {
    let c = config(YAML);
    let table = TopTable::new(5).with_sample(8);
    table.tick(T0);
    let bound = table.bind(&c);
    let n = node(&c, "web.remote_address");
    for _ in 0..8000 {
        bound.record(n, &ip("10.0.0.1"), 1, false, false);
    }
    for _ in 0..100 {
        bound.record(n, &ip("10.0.0.2"), 1, true, true);
    }
    let lists = bound.of(n).unwrap().lists(table.now_s(), 5);
    let a = &lists.by_hits[0];
    // 1000 samples expected: within ±15 % with overwhelming odds, each weighing 8.
    assert_eq!(a.value, "remote_address=10.0.0.1");
    assert!(
        (6800..=9200).contains(&a.hits) && a.hits.is_multiple_of(8),
        "{}",
        a.hits
    );
    assert_eq!(
        names(&lists.by_refused),
        vec![("remote_address=10.0.0.2", 100, 100)]
    );
}

/// Values split back into their entries: each descriptor value shown through the function, the
/// keys as they are; a value cut at the cap and shown otherwise ends in `…`.
#[test]
fn values_are_shown_entry_by_entry() {
    let c = config(YAML);
    let table = TopTable::new(4).with_sample(1);
    table.tick(T0);
    let bound = table.bind(&c);
    let n = node(&c, "web.path.user");
    let long = "v".repeat(MAX_VALUE_BYTES);
    bound.record(n, &[e("path", "x, y=z"), e("user", "w")], 1, true, true);
    bound.record(n, &[e("path", "q"), e("user", &long)], 2, false, true);
    let mut by_hits = bound.of(n).unwrap().lists(table.now_s(), 4).by_hits;
    assert_eq!(by_hits[1].value, "path=x, y=z, user=w");
    by_hits[1].show_values(&|_, v| format!("<{v}>"));
    assert_eq!(by_hits[1].value, "path=<x, y=z>, user=<w>");
    by_hits[0].show_values(&|_, v| format!("<{}>", v.len()));
    let cut = MAX_VALUE_BYTES - "path?q?user?".len();
    assert_eq!(by_hits[0].value, format!("path=<1>, user=<{cut}>…"));
}
