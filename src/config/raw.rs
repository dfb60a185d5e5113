//! The YAML file as written: envoyproxy/ratelimit's schema plus turnstile's additions, before validation.

use serde::{de, Deserialize, Deserializer};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateApi {
    #[serde(default)]
    pub(crate) allow_overrides: bool,
    #[serde(default)]
    pub(crate) max_requests_cap: Option<u32>,
    #[serde(default)]
    pub(crate) max_in_queue_cap: Option<u32>,
    #[serde(default)]
    pub(crate) keys: Vec<RawRateApiKey>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateApiKey {
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) key: Option<String>,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) window: Option<String>,
    #[serde(default)]
    pub(crate) max_requests: Option<u32>,
    #[serde(default)]
    pub(crate) max_in_queue: Option<u32>,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) max_wait: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) key: Option<String>,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) value: Option<String>,
    #[serde(default)]
    pub(crate) rate_limit: Option<RawRateLimit>,
    /// turnstile: several limits on one descriptor (burst + sustained); each is decided on its own.
    #[serde(default)]
    pub(crate) rate_limits: Option<Vec<RawRateLimit>>,
    #[serde(default)]
    pub(crate) descriptors: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    pub(crate) shadow_mode: bool,
    #[serde(default)]
    pub(crate) quota_mode: bool,
    #[serde(default)]
    pub(crate) detailed_metric: bool,
    #[serde(default)]
    pub(crate) value_to_metric: bool,
    #[serde(default)]
    pub(crate) share_threshold: bool,
    /// Free-form; returned to Envoy as dynamic metadata when the descriptor matches.
    #[serde(default)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) unit: Option<String>,
    #[serde(default)]
    pub(crate) requests_per_unit: Option<u32>,
    /// Windows of this many units (`unit_multiplier` as Envoy's API names it).
    #[serde(default)]
    pub(crate) unit_multiplier: Option<u32>,
    /// turnstile: windows following an IANA time zone's calendar (day, week, month, year).
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) calendar: Option<String>,
    #[serde(default)]
    pub(crate) unlimited: bool,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) replaces: Option<Vec<RawReplaces>>,
    /// turnstile: fixed_window (default), sliding_window or token_bucket.
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) algorithm: Option<String>,
    /// turnstile: token bucket capacity; defaults to requests_per_unit.
    #[serde(default)]
    pub(crate) burst: Option<u32>,
    /// turnstile: queued waiting instead of an immediate OVER_LIMIT.
    #[serde(default)]
    pub(crate) queue: Option<RawQueue>,
    /// turnstile: with Redis, decide in memory and sync in the background (`LOCAL_FIRST`).
    #[serde(default)]
    pub(crate) local_first: Option<bool>,
    /// turnstile: hits a check (`hits_addend: 0`) holds for its request until the request's
    /// usage is reported, or `reserve_for` passes.
    #[serde(default)]
    pub(crate) reserve: Option<u32>,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) reserve_for: Option<String>,
    /// Set by an xDS overlay (`TURNSTILE_XDS_OVERLAY`): which of the fields above it wrote, and
    /// its file (`reserve,reserve_for from overlay.yaml`). A file cannot say it.
    #[serde(skip)]
    pub(crate) overlaid: Option<std::sync::Arc<str>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplaces {
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    #[serde(default)]
    pub(crate) max_waiting: Option<u32>,
    #[serde(default, deserialize_with = "opt_scalar")]
    pub(crate) max_wait: Option<String>,
}

/// A scalar where envoyproxy/ratelimit takes a string: strings, integers and booleans are read
/// as their text (`value: 123` is common), floats are refused as the reference refuses them.
pub(super) fn opt_scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct ScalarVisitor;
    impl<'de> de::Visitor<'de> for ScalarVisitor {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string, integer or boolean")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(E::custom(format_args!(
                "a float ({v}) is not allowed here; quote it if it is meant as text"
            )))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(ScalarVisitor)
        }
    }
    d.deserialize_option(ScalarVisitor)
}
