//! Which limit a bucket draws on: a `BucketId` (a map of strings) matched against its domain's
//! descriptor tree as one descriptor.
//!
//! The rule. A map has no order, so the tree gives it: at the top level, the bucket's keys that
//! name nodes of that level are tried in ascending key order; a key's value is matched as a
//! `ShouldRateLimit` entry is (exact value, then wildcards in file order, then the key-only
//! node), and the walk goes one level down with the remaining keys. Every key of the bucket must
//! be used, and the node the last one reaches is the bucket's node: the depth rule of
//! `ShouldRateLimit`, no fallback to a shallower node. The first complete walk wins.
//!
//! The node's limit decides: none (a node that only groups children or whitelists), an
//! `unlimited` one or `shadow_mode` allow all; one fixed-window or token-bucket limit is shared
//! among the Envoys; what a token bucket cannot express (sliding windows, queues, several limits
//! on one node) is refused. Buckets of different Envoys with the same counter key share one
//! limit; a key-only node gives every value its own, as in `ShouldRateLimit`.

use smallvec::SmallVec;

use crate::config::{Algorithm, Config, Level, Node};
use crate::descriptor::{self, Entry, Matched};

/// Entries a bucket may have: enough for any tree people write, and a bound on the walk.
pub const MAX_BUCKET_ENTRIES: usize = 8;

/// Nodes the walk may visit for one bucket before it gives up (backtracking is bounded).
const MAX_STEPS: usize = 4096;

/// A bucket's entries, sorted by key: the book's name for a bucket.
pub type BucketKey = Vec<(String, String)>;

/// What one fair share is a share of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSpec {
    pub requests_per_unit: u32,
    /// The window's length (unit × unit_multiplier), which is also the token bucket's fill
    /// interval.
    pub unit_secs: u64,
    /// `token_bucket`'s burst; `None` for fixed windows (capacity = one fill).
    pub burst: Option<u32>,
}

/// A limit that buckets share, named by its counter key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLimit {
    pub domain: String,
    /// The counter key `ShouldRateLimit` would use: buckets with the same one share the limit.
    pub key: String,
    /// `domain.key_value...`, for logs and metrics.
    pub stat_key: String,
    pub spec: LimitSpec,
}

/// Where a bucket's assignment comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignedBy {
    Limit(SharedLimit),
    /// Nothing limits the bucket; the reason is for logs.
    AllowAll(&'static str),
    /// The bucket matched a limit RLQS cannot enforce; the message says why. Allowed all.
    Refused(String),
}

/// The bucket's key from its map.
pub fn bucket_key(map: &std::collections::HashMap<String, String>) -> BucketKey {
    let mut k: BucketKey = map.iter().map(|(a, b)| (a.clone(), b.clone())).collect();
    k.sort();
    k
}

/// The limit `bucket` of `domain` draws on under `config`.
pub fn resolve(config: &Config, domain: &str, bucket: &BucketKey) -> AssignedBy {
    let Some(tree) = config.domain(domain) else {
        return AssignedBy::AllowAll("unknown domain");
    };
    if bucket.len() > MAX_BUCKET_ENTRIES {
        return AssignedBy::Refused(format!(
            "a bucket of {} entries (at most {MAX_BUCKET_ENTRIES} are matched)",
            bucket.len()
        ));
    }
    let mut walk = Walk {
        left: bucket
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        path: SmallVec::new(),
        entries: Vec::new(),
        steps: 0,
    };
    if !walk.descend(&tree.root) {
        return AssignedBy::AllowAll("no limit matches the bucket");
    }
    let matched = Matched { path: walk.path };
    target(domain, &walk.entries, &matched)
}

fn target(domain: &str, entries: &[Entry<'_>], matched: &Matched<'_>) -> AssignedBy {
    let node = matched.node();
    let limit = match &node.limits[..] {
        [] => return AssignedBy::AllowAll("the bucket's node has no limit"),
        [l] => l,
        more => {
            return AssignedBy::Refused(format!(
                "{} has {} limits; an RLQS bucket gets one token bucket",
                node.stat_key,
                more.len()
            ))
        }
    };
    if limit.unlimited || node.shadow_mode {
        return AssignedBy::AllowAll("unlimited or shadow_mode");
    }
    let burst = match limit.algorithm {
        Algorithm::FixedWindow => None,
        Algorithm::TokenBucket { burst } => Some(burst),
        Algorithm::SlidingWindow => return AssignedBy::Refused(refusal(node, "sliding_window")),
        Algorithm::FromFirstHit => return AssignedBy::Refused(refusal(node, "from_first_hit")),
    };
    if limit.queue.is_some() {
        return AssignedBy::Refused(refusal(node, "a queue"));
    }
    if limit.calendar.is_some() {
        return AssignedBy::Refused(refusal(node, "a calendar window"));
    }
    AssignedBy::Limit(SharedLimit {
        domain: domain.to_string(),
        key: descriptor::counter_key(domain, entries, Some(matched), 0),
        stat_key: node.stat_key.to_string(),
        spec: LimitSpec {
            requests_per_unit: limit.requests_per_unit,
            unit_secs: limit.window_secs(),
            burst,
        },
    })
}

/// Why a node's limit cannot be an RLQS token bucket, for the log and `turnstile check`.
fn refusal(node: &Node, what: &str) -> String {
    format!(
        "{} uses {what}, which an Envoy token bucket cannot enforce; \
         RLQS allows its buckets everything (use an epoch-aligned fixed_window or token_bucket)",
        node.stat_key
    )
}

/// Why each limit of `config` would be refused for RLQS use, one line each (`turnstile check`).
pub fn refusals(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    config.for_each_node(&mut |n| {
        if n.limits.len() > 1 {
            out.push(format!(
                "{} has {} limits; an RLQS bucket gets one token bucket",
                n.stat_key,
                n.limits.len()
            ));
        } else if let Some(l) = n.limits.first().filter(|l| !l.unlimited && !n.shadow_mode) {
            if l.algorithm == Algorithm::SlidingWindow {
                out.push(refusal(n, "sliding_window"));
            } else if l.queue.is_some() {
                out.push(refusal(n, "a queue"));
            } else if l.calendar.is_some() {
                out.push(refusal(n, "a calendar window"));
            }
        }
    });
    out.sort();
    out
}

/// A depth-first walk over the bucket's unused entries.
struct Walk<'b, 'c> {
    /// Entries not used yet, in ascending key order.
    left: Vec<(&'b str, &'b str)>,
    path: SmallVec<[&'c Node; 4]>,
    entries: Vec<Entry<'b>>,
    steps: usize,
}

impl<'c> Walk<'_, 'c> {
    fn descend(&mut self, level: &'c Level) -> bool {
        if self.left.is_empty() {
            return !self.path.is_empty();
        }
        for i in 0..self.left.len() {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return false;
            }
            let (key, value) = self.left[i];
            let Some(node) = descriptor::step(level, key, value) else {
                continue;
            };
            self.left.remove(i);
            self.path.push(node);
            self.entries.push(Entry { key, value });
            if self.descend(&node.children) {
                return true;
            }
            self.entries.pop();
            self.path.pop();
            self.left.insert(i, (key, value));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadOptions;

    const TREE: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    value: "vip-*"
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    value: "free-*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tenant
    descriptors:
      - key: path
        value: /api
        rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 9}
  - key: slow
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}
  - key: open
    rate_limit: {unlimited: true}
  - key: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 50}
  - key: monthly
    rate_limit: {unit: month, calendar: UTC, requests_per_unit: 50}
"#;

    fn config() -> Config {
        Config::from_sources(&[("t.yaml".into(), TREE.into())], LoadOptions::default()).unwrap()
    }

    fn bucket(pairs: &[(&str, &str)]) -> BucketKey {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        bucket_key(&map)
    }

    fn limit(t: AssignedBy) -> SharedLimit {
        match t {
            AssignedBy::Limit(l) => l,
            other => panic!("not a limit: {other:?}"),
        }
    }

    #[test]
    fn key_only_node_gives_every_value_its_own_limit() {
        let c = config();
        let a = limit(resolve(&c, "d", &bucket(&[("user", "alice")])));
        let b = limit(resolve(&c, "d", &bucket(&[("user", "bob")])));
        assert_eq!(a.key, "d_user_alice_");
        assert_ne!(a.key, b.key);
        assert_eq!(a.spec.requests_per_unit, 10);
        assert_eq!(a.spec.burst, None);
    }

    #[test]
    fn wildcards_match_before_the_key_only_node_and_share_threshold_shares() {
        let c = config();
        assert_eq!(
            limit(resolve(&c, "d", &bucket(&[("user", "vip-1")])))
                .spec
                .requests_per_unit,
            100
        );
        let f1 = limit(resolve(&c, "d", &bucket(&[("user", "free-1")])));
        let f2 = limit(resolve(&c, "d", &bucket(&[("user", "free-2")])));
        assert_eq!(f1.key, f2.key, "share_threshold: one limit for all");
        assert_eq!(f1.spec.unit_secs, 60);
    }

    #[test]
    fn a_quota_refills_over_the_limits_window() {
        let c = config();
        let five = limit(resolve(&c, "d", &bucket(&[("five", "x")])));
        assert_eq!(five.spec.unit_secs, 300);
        let AssignedBy::Refused(why) = resolve(&c, "d", &bucket(&[("monthly", "x")])) else {
            panic!("a calendar window must be refused");
        };
        assert!(why.contains("uses a calendar window"), "{why}");
        assert_eq!(refusals(&c).len(), 2, "{:?}", refusals(&c));
        assert!(refusals(&c).contains(&why));
    }

    #[test]
    fn entries_are_taken_in_the_trees_order_not_the_maps() {
        let c = config();
        // `path` sorts before `tenant`, but the tree has tenant on top.
        let l = limit(resolve(
            &c,
            "d",
            &bucket(&[("path", "/api"), ("tenant", "t1")]),
        ));
        assert_eq!(l.key, "d_tenant_t1_path_/api_");
        assert_eq!(l.spec.burst, Some(9));
    }

    #[test]
    fn every_entry_must_be_used_and_no_match_allows_all() {
        let c = config();
        for b in [
            bucket(&[("tenant", "t1")]),
            bucket(&[("user", "a"), ("extra", "x")]),
            bucket(&[("nope", "x")]),
        ] {
            assert!(
                matches!(resolve(&c, "d", &b), AssignedBy::AllowAll(_)),
                "{b:?}"
            );
        }
        assert!(matches!(
            resolve(&c, "other", &bucket(&[("user", "a")])),
            AssignedBy::AllowAll("unknown domain")
        ));
        assert!(matches!(
            resolve(&c, "d", &bucket(&[("open", "x")])),
            AssignedBy::AllowAll(_)
        ));
    }

    #[test]
    fn what_a_token_bucket_cannot_express_is_refused_with_the_reason() {
        let c = config();
        let AssignedBy::Refused(why) = resolve(&c, "d", &bucket(&[("slow", "x")])) else {
            panic!("sliding_window must be refused");
        };
        assert!(
            why.contains("d.slow") && why.contains("sliding_window"),
            "{why}"
        );
        assert!(refusals(&c).contains(&why), "{:?}", refusals(&c));
    }
}
