//! Arbitrary requests → `service::validate` → `descriptor::find` → `descriptor::counter_key` /
//! `key_hash` / `shard_of`: never panics, and keys follow their layout exactly.
//!
//! Properties checked on every input:
//! - `validate` refuses only with INVALID_ARGUMENT and a message; what it accepts is within every
//!   limit, and the limits are taken from the input as well as the defaults;
//! - a match covers every entry (one node per entry, no fallback to a parent);
//! - the key is envoyproxy/ratelimit's layout: `domain_key1_value1_…_` (a `share_threshold`
//!   level contributing its pattern), plus `#i` for the second and later limits;
//! - hashing is deterministic and `shard_of` stays in range.
//!
//! Injectivity: the layout joins parts with `_`, which keys, values and domains may contain, so
//! it is not injective in general: ("a_b", "c") and ("a", "b_c") give the same text, exactly as in
//! envoyproxy/ratelimit (whose Redis keys turnstile shares). Where no domain, key, value or shared
//! pattern contains `_`, it is decidable and checked: the key parses back into the parts it came
//! from (a left inverse), and no two different part lists of one input share a key.
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use turnstile::config::{Config, LoadOptions};
use turnstile::descriptor::{counter_key, find};
use turnstile::limiter::key::{key_hash, shard_of};
use turnstile::service::{validate, Request, RequestLimits, RlsError};

/// Exact values, wildcards anywhere, key-only defaults, nesting, several limits, and
/// `share_threshold` at the top and under a parent. A second domain with `_` in its name lets
/// domains and keys run into each other.
const CONFIG: &str = r#"
domain: fz
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
    rate_limits:
      - {unit: second, requests_per_unit: 4}
      - {unit: minute, requests_per_unit: 40}
  - key: parent
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 6}
      - key: tenant
        value: "t*"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 7}
  - key: shared
    value: "p-*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 8}
    descriptors:
      - key: k
        rate_limit: {unit: hour, requests_per_unit: 9}
  - key: under_score
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

const CONFIG_2: &str = r#"
domain: fz_k
descriptors:
  - key: exact
    rate_limit: {unit: second, requests_per_unit: 11}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 12}
"#;

fn config() -> &'static Config {
    static CONFIG_CELL: OnceLock<Config> = OnceLock::new();
    CONFIG_CELL.get_or_init(|| {
        Config::from_sources(
            &[
                ("fz.yaml".into(), CONFIG.into()),
                ("fz_k.yaml".into(), CONFIG_2.into()),
            ],
            LoadOptions::default(),
        )
        .expect("the fuzz config is valid")
    })
}

const DOMAINS: &[&str] = &["fz", "fz_k", "", "other"];
const KEYS: &[&str] = &[
    "k",
    "parent",
    "child",
    "tenant",
    "shared",
    "under_score",
    "exact",
    "",
];
const VALUES: &[&str] = &[
    "exact", "abcz", "az", "a", "abc", "t1", "t", "p-1", "p-", "p-*", "x", "", "_", "a_b", "*",
];

/// Mostly words the config knows, so matching goes deep; sometimes anything at all.
#[derive(Arbitrary, Debug)]
enum Word {
    Known(u8),
    Any(String),
}

impl Word {
    fn pick(&self, from: &[&str]) -> String {
        match self {
            Word::Known(i) => from[*i as usize % from.len()].to_owned(),
            Word::Any(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    domain: Word,
    descriptors: Vec<Vec<(Word, Word)>>,
    /// Tighter limits than the defaults, so every limit's boundary is reached.
    limits: Option<(u8, u8, u8, u16)>,
}

fn request(input: &Input) -> RateLimitRequest {
    RateLimitRequest {
        domain: input.domain.pick(DOMAINS),
        descriptors: input
            .descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.pick(KEYS),
                        value: v.pick(VALUES),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fn limits(input: &Input) -> RequestLimits {
    match input.limits {
        None => RequestLimits::default(),
        Some((d, e, k, v)) => RequestLimits {
            max_descriptors: d.into(),
            max_entries: e.into(),
            max_key_len: k.into(),
            max_value_len: v.into(),
            max_message_bytes: 1 << 20,
        },
    }
}

fn within(req: &Request<'_>, l: &RequestLimits) -> bool {
    !req.domain.is_empty()
        && !req.descriptors.is_empty()
        && req.descriptors.len() <= l.max_descriptors
        && req.descriptors.iter().all(|d| {
            !d.entries.is_empty()
                && d.entries.len() <= l.max_entries
                && d.entries.iter().all(|e| {
                    !e.key.is_empty()
                        && e.key.len() <= l.max_key_len
                        && e.value.len() <= l.max_value_len
                })
        })
}

/// Splits a key made only of `_`-free parts back into them: (parts, limit index).
fn parse(key: &str) -> (Vec<&str>, usize) {
    let (body, index) = match key.strip_suffix('_') {
        Some(body) => (body, 0),
        None => {
            let (body, n) = key.rsplit_once("_#").expect("'_' or '_#i' ends a key");
            (body, n.parse().expect("the limit index is a number"))
        }
    };
    (body.split('_').collect(), index)
}

fuzz_target!(|input: Input| {
    let owned = request(&input);
    let req = Request::of(&owned);
    let limits = limits(&input);
    match validate(&req, &limits) {
        Err(RlsError::InvalidArgument(m)) => {
            assert!(!m.is_empty());
            assert!(!within(&req, &limits), "refused a valid request: {m}");
            return;
        }
        Err(other) => panic!("validate may only refuse with InvalidArgument, got {other:?}"),
        Ok(()) => assert!(within(&req, &limits), "accepted {req:?} over {limits:?}"),
    }

    let config = config();
    let domain = config.domain(req.domain);
    // Key → the parts it was made from, for the keys whose parts are `_`-free.
    let mut seen: HashMap<String, (Vec<String>, usize)> = HashMap::new();
    for d in &req.descriptors {
        let matched = domain.and_then(|dom| find(dom, &d.entries));
        let limit_count = match &matched {
            Some(m) => {
                assert_eq!(m.path.len(), d.entries.len(), "one node per entry");
                for (node, e) in m.path.iter().zip(&d.entries) {
                    assert_eq!(&*node.key, e.key);
                }
                m.node().limits.len().max(1)
            }
            None => 1,
        };
        for index in 0..limit_count {
            let key = counter_key(req.domain, &d.entries, matched.as_ref(), index);

            // The layout, spelled out.
            let mut parts = vec![req.domain.to_owned()];
            for (i, e) in d.entries.iter().enumerate() {
                parts.push(e.key.to_owned());
                let shared = matched
                    .as_ref()
                    .and_then(|m| m.path.get(i))
                    .filter(|n| n.share_threshold)
                    .and_then(|n| n.value.as_deref().map(str::to_owned));
                parts.push(shared.unwrap_or_else(|| e.value.to_owned()));
            }
            let mut expected = parts.join("_");
            expected.push('_');
            if index > 0 {
                expected.push_str(&format!("#{index}"));
            }
            assert_eq!(key, expected);

            let h = key_hash(&key);
            assert_eq!(h, key_hash(&expected));
            for n in 1..=16 {
                assert!(shard_of(h, n) < n);
            }

            if parts.iter().all(|p| !p.contains('_')) {
                let (back, back_index) = parse(&key);
                assert_eq!(back, parts, "the key parses back into its parts");
                assert_eq!(back_index, index);
                if let Some(earlier) = seen.get(&key) {
                    assert_eq!(earlier, &(parts.clone(), index), "two part lists, one key");
                }
                seen.insert(key, (parts, index));
            }
        }
    }
});
