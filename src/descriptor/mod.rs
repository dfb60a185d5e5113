//! Request descriptor → matched config node → counter key text (pure functions; the limiter
//! hashes the key and picks its shard), for the Envoy and RLQS doors; Limitador's limits matched
//! by their index and CEL (`limitador`).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use smallvec::SmallVec;

use crate::config::{Domain, Level, Node};

pub mod limitador;

/// One entry of a request's descriptor, borrowed from wherever the request was read: the
/// protobuf bytes of a gRPC call, or a decoded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

impl<'a> From<&'a PbEntry> for Entry<'a> {
    fn from(e: &'a PbEntry) -> Entry<'a> {
        Entry {
            key: &e.key,
            value: &e.value,
        }
    }
}

/// The config node a descriptor matched, with the node of every level on the way to it
/// (the counter key needs them: a `share_threshold` wildcard puts its pattern in the key).
#[derive(Debug)]
pub struct Matched<'c> {
    pub path: SmallVec<[&'c Node; 4]>,
}

impl<'c> Matched<'c> {
    pub fn node(&self) -> &'c Node {
        self.path[self.path.len() - 1]
    }
}

/// Walks the tree one level per entry: exact `key_value`, then wildcards in file order, then the
/// key-only node. Only a node at the depth of the last entry counts; there is no fallback to a
/// shallower node's limit.
pub fn find<'c>(domain: &'c Domain, entries: &[Entry<'_>]) -> Option<Matched<'c>> {
    let mut level: &'c Level = &domain.root;
    let mut path = SmallVec::new();
    for entry in entries {
        let node = step(level, entry.key, entry.value)?;
        path.push(node);
        level = &node.children;
    }
    if path.is_empty() {
        None
    } else {
        Some(Matched { path })
    }
}

/// One level of [`find`]: the node `key`/`value` matches at `level`, if any.
pub fn step<'c>(level: &'c Level, key: &str, value: &str) -> Option<&'c Node> {
    let group = level.group(key)?;
    if let Some(n) = group.exact.get(value) {
        return Some(n);
    }
    if let Some(n) = group.wildcards.find(value) {
        return Some(n);
    }
    group.default.as_deref()
}

/// The counter key: envoyproxy/ratelimit's layout without the window start,
/// `domain_key1_value1_key2_value2_`, so Redis keys can be shared with it. A level matched by a
/// `share_threshold` wildcard contributes its pattern, so every matching value shares one counter.
/// The limit index is appended for the second and later limits of one descriptor.
pub fn counter_key(
    domain: &str,
    entries: &[Entry<'_>],
    matched: Option<&Matched<'_>>,
    limit_index: usize,
) -> String {
    let mut len = domain.len() + 1;
    for e in entries {
        len += e.key.len() + e.value.len() + 2;
    }
    let mut key = String::with_capacity(len + if limit_index > 0 { 4 } else { 0 });
    key.push_str(domain);
    key.push('_');
    for (i, e) in entries.iter().enumerate() {
        key.push_str(e.key);
        key.push('_');
        let shared = matched
            .and_then(|m| m.path.get(i))
            .filter(|n| n.share_threshold)
            .and_then(|n| n.value.as_deref());
        key.push_str(shared.unwrap_or(e.value));
        key.push('_');
    }
    if limit_index > 0 {
        key.push('#');
        key.push_str(&limit_index.to_string());
    }
    key
}

/// The stats series a matched descriptor counts in, as envoyproxy/ratelimit names it after its
/// domain (`GetLimit` in its `src/config/config_impl.go`), when that is not the matched node's
/// own stat key; `None` when it is. With `detailed_metric` on the leaf, every level is
/// `key_value` of the request (a `share_threshold` wildcard level keeps its pattern, and then
/// the other levels drop an empty value's `_`); otherwise levels matched by value keep it,
/// `value_to_metric` levels matched by key or wildcard take the request's value, and wildcard
/// levels otherwise keep their pattern.
pub fn stat_path(entries: &[Entry<'_>], m: &Matched<'_>) -> Option<String> {
    let leaf = m.node();
    if !leaf.detailed_metric && !m.path.iter().any(|n| n.value_to_metric) {
        return None;
    }
    fn pattern(n: &Node) -> Option<&str> {
        n.value.as_deref().filter(|v| v.contains('*'))
    }
    fn shared(n: &Node) -> Option<&str> {
        pattern(n).filter(|_| n.share_threshold)
    }
    let any_shared = m.path.iter().any(|n| shared(n).is_some());
    let mut out = String::with_capacity(64);
    for (i, (e, n)) in entries.iter().zip(&m.path).enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(e.key);
        let value = if let Some(p) = shared(n) {
            p
        } else if leaf.detailed_metric {
            if any_shared && e.value.is_empty() {
                continue;
            }
            out.push('_');
            out.push_str(e.value);
            continue;
        } else if let Some(p) = pattern(n) {
            if n.value_to_metric {
                e.value
            } else {
                p
            }
        } else if n.value.is_some() || n.value_to_metric {
            e.value
        } else {
            ""
        };
        if !value.is_empty() {
            out.push('_');
            out.push_str(value);
        }
    }
    let own = leaf.stat_key.split_once('.').map_or("", |(_, path)| path);
    (out != own).then_some(out)
}

/// The stats series of a descriptor carrying Envoy's `limit` override, after its domain: the
/// request's entries, `key_value` (or `key` for an empty value), joined by dots (the
/// reference's `descriptorKey`).
pub fn override_stat_path(entries: &[Entry<'_>]) -> String {
    let mut out = String::with_capacity(64);
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(e.key);
        if !e.value.is_empty() {
            out.push('_');
            out.push_str(e.value);
        }
    }
    out
}

/// Request entries from `(key, value)` pairs, for the tests of the modules that match them.
#[cfg(test)]
pub(crate) fn entries<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<Entry<'a>> {
    pairs
        .iter()
        .map(|&(key, value)| Entry { key, value })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::glob;
    use crate::config::{Config, LoadOptions};

    fn config(yaml: &str) -> Config {
        Config::from_sources(&[("t.yaml".into(), yaml.into())], LoadOptions::default()).unwrap()
    }

    const TREE: &str = r#"
domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "a*z"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: parent
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 6}
  - key: shared
    value: "p-*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 7}
"#;

    fn rpu(c: &Config, pairs: &[(&str, &str)]) -> Option<u32> {
        let d = c.domain("d").unwrap();
        find(d, &entries(pairs)).and_then(|m| m.node().limits.first().map(|l| l.requests_per_unit))
    }

    #[test]
    fn exact_then_wildcard_in_file_order_then_key_only() {
        let c = config(TREE);
        assert_eq!(rpu(&c, &[("k", "exact")]), Some(1));
        assert_eq!(
            rpu(&c, &[("k", "abcz")]),
            Some(2),
            "first wildcard in file order"
        );
        assert_eq!(rpu(&c, &[("k", "abc")]), Some(3));
        assert_eq!(rpu(&c, &[("k", "other")]), Some(4), "key-only default");
        assert_eq!(rpu(&c, &[("nope", "x")]), None);
    }

    #[test]
    fn depth_rule_has_no_fallback_to_parent() {
        let c = config(TREE);
        assert_eq!(rpu(&c, &[("parent", "x")]), Some(5));
        assert_eq!(rpu(&c, &[("parent", "x"), ("child", "y")]), Some(6));
        assert_eq!(
            rpu(&c, &[("parent", "x"), ("other", "y")]),
            None,
            "deeper than config"
        );
        assert_eq!(
            rpu(&c, &[("k", "exact"), ("child", "y")]),
            None,
            "no child under k"
        );
    }

    #[test]
    fn glob_matches_anywhere_several_times() {
        assert!(glob("*", ""));
        assert!(glob("a*", "a"));
        assert!(glob("*b*d", "abcd"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
        assert!(glob("**x", "x"));
        assert!(!glob("abc", "abcd"));
        assert!(glob("/api/*/users/*", "/api/v1/users/42"));
    }

    #[test]
    fn counter_keys_follow_reference_layout_and_share_threshold() {
        let c = config(TREE);
        let d = c.domain("d").unwrap();
        let e = entries(&[("k", "abc")]);
        let m = find(d, &e).unwrap();
        assert_eq!(counter_key("d", &e, Some(&m), 0), "d_k_abc_");
        assert_eq!(counter_key("d", &e, Some(&m), 2), "d_k_abc_#2");
        let e1 = entries(&[("shared", "p-1")]);
        let e2 = entries(&[("shared", "p-2")]);
        let k1 = counter_key("d", &e1, find(d, &e1).as_ref(), 0);
        let k2 = counter_key("d", &e2, find(d, &e2).as_ref(), 0);
        assert_eq!(k1, "d_shared_p-*_");
        assert_eq!(
            k1, k2,
            "share_threshold: one counter for every matching value"
        );
    }

    /// Series names from envoyproxy/ratelimit's `test/config/config_test.go`: the stats key its
    /// `GetLimit` gives, after the domain.
    #[test]
    fn stat_paths_are_the_references() {
        let c = config(
            r#"
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: "read*"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: wild
    value: "foo*"
    descriptors:
      - key: other
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: "files/*"
    share_threshold: true
    value_to_metric: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    value: p
    rate_limit: {unit: minute, requests_per_unit: 1}
"#,
        );
        let d = c.domain("d").unwrap();
        let path = |pairs: &[(&str, &str)]| {
            let e = entries(pairs);
            stat_path(&e, &find(d, &e).unwrap())
        };
        // TestValueToMetric_WithEmptyValue (line 1428): an empty value adds no `_`.
        assert_eq!(
            path(&[("route", ""), ("http_method", "GET")]).as_deref(),
            Some("route.http_method_GET")
        );
        // Line 1395: value_to_metric takes the request's value at key and wildcard levels.
        assert_eq!(
            path(&[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ])
            .as_deref(),
            Some("user_alice.action_readfile.resource")
        );
        // A wildcard level without the flag keeps its pattern (`wild_foo*.other_bar`).
        assert_eq!(
            path(&[("wild", "foobar"), ("other", "bar")]).as_deref(),
            Some("wild_foo*.other_bar")
        );
        // TestShareThreshold (line 1689): share_threshold wins over value_to_metric and
        // detailed_metric: the pattern, which is the node's own series.
        assert_eq!(path(&[("files", "files/a.pdf")]), None);
        // detailed_metric: key_value of the request.
        assert_eq!(path(&[("detailed", "x")]).as_deref(), Some("detailed_x"));
        assert_eq!(path(&[("plain", "p")]), None, "no flag: the node's own");
        // Overrides (line 285): the request's entries.
        assert_eq!(
            override_stat_path(&entries(&[("key1", "value1"), ("subkey1", "something")])),
            "key1_value1.subkey1_something"
        );
    }
}
