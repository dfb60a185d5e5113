//! `RateLimitConfig` resources → the same parsed form as YAML files, validated the same way.

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{pb, TYPE_URL, WRAPPED_TYPE_URL};
use crate::config::build::{Builder, LiveConfig};
use crate::config::overlay::OverlayMatches;
use crate::config::raw::{RawDescriptor, RawRateLimit, RawReplaces};
use crate::config::{Config, ConfigError, LoadOptions, Overlay};

/// Builds the config that a set of `RateLimitConfig` resources describes, through the same
/// validation as YAML files. Errors name the resource: `RateLimitConfig "name": path: message`.
/// A resource is never held decoded whole: its name and domain are read first, then each
/// top-level descriptor is decoded from its bytes, built, and dropped, so a big push holds its
/// bytes and the tree, not a decoded copy of every descriptor beside it; each resource's bytes
/// are freed once it is built. `overlay` (`TURNSTILE_XDS_OVERLAY`) writes turnstile's own
/// fields into the limits it names; the ones it names that the push lacks are listed in the
/// config's `overlay_unmatched`.
pub fn config_from_resources(
    resources: Vec<Any>,
    opts: LoadOptions,
    live: &LiveConfig,
    overlay: Option<&Overlay>,
) -> Result<Config, ConfigError> {
    let mut builder = Builder::beside(live);
    let empty = Overlay::default();
    let overlay = overlay.unwrap_or(&empty);
    let mut matched = overlay.matched();
    for (i, any) in resources.into_iter().enumerate() {
        let undecodable = |message| ConfigError {
            file: format!("resources[{i}]"),
            path: String::new(),
            message,
        };
        let bytes = config_bytes(any).map_err(undecodable)?;
        let (head, listed) = (ConfigHead::decode(bytes.clone()), Listed::decode(bytes));
        let (head, listed) = head
            .and_then(|h| Ok((h, listed?)))
            .map_err(|e| undecodable(format!("cannot decode RateLimitConfig: {e}")))?;
        let descriptors = listed.descriptors.into_iter().enumerate();
        let decoded = descriptors.map(|(n, d)| {
            pb::RateLimitDescriptor::decode(d).map_err(|e| {
                undecodable(format!(
                    "cannot decode RateLimitConfig: descriptors[{n}]: {e}"
                ))
            })
        });
        let resource = label(i, &head.name);
        add_config(
            &mut builder,
            &resource,
            head.domain,
            decoded,
            opts,
            overlay,
            &mut matched,
        )?;
    }
    let mut config = builder.finish();
    config.from_xds = true;
    config.overlay_unmatched = overlay.unmatched(&matched);
    Ok(config)
}

/// A `RateLimitConfig`'s name and domain, its descriptors skipped.
#[derive(Clone, PartialEq, Message)]
struct ConfigHead {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    domain: String,
}

/// A `RateLimitConfig`'s descriptors, each still the bytes of its message (sharing the
/// resource's buffer).
#[derive(Clone, PartialEq, Message)]
struct Listed {
    #[prost(bytes = "bytes", repeated, tag = "3")]
    descriptors: Vec<Bytes>,
}

/// The bytes of the `RateLimitConfig` a resource carries, unwrapped if it is wrapped, taken
/// from the resource without a copy.
fn config_bytes(any: Any) -> Result<Bytes, String> {
    if any.type_url == WRAPPED_TYPE_URL {
        let wrapped = Resource::decode(any.value.as_slice())
            .map_err(|e| format!("cannot decode {WRAPPED_TYPE_URL}: {e}"))?;
        let inner = wrapped
            .resource
            .ok_or_else(|| format!("wrapped resource \"{}\" has no body", wrapped.name))?;
        if inner.type_url != TYPE_URL {
            return Err(format!(
                "unexpected resource type {} (expected {TYPE_URL})",
                inner.type_url
            ));
        }
        return Ok(Bytes::from(inner.value));
    }
    if any.type_url != TYPE_URL {
        return Err(format!(
            "unexpected resource type {} (expected {TYPE_URL})",
            any.type_url
        ));
    }
    Ok(Bytes::from(any.value))
}

/// How errors name resource `i`.
fn label(i: usize, name: &str) -> String {
    if name.is_empty() {
        format!("RateLimitConfig resources[{i}]")
    } else {
        format!("RateLimitConfig \"{name}\"")
    }
}

/// As [`config_from_resources`], from decoded messages.
pub fn config_from_protos(
    configs: Vec<pb::RateLimitConfig>,
    opts: LoadOptions,
) -> Result<Config, ConfigError> {
    let mut builder = Builder::default();
    let none = Overlay::default();
    let mut matched = none.matched();
    for (i, c) in configs.into_iter().enumerate() {
        let descriptors = c.descriptors.into_iter().map(Ok);
        let resource = label(i, &c.name);
        add_config(
            &mut builder,
            &resource,
            c.domain,
            descriptors,
            opts,
            &none,
            &mut matched,
        )?;
    }
    let mut config = builder.finish();
    config.from_xds = true;
    Ok(config)
}

/// The resource errors name `resource` (its `label`): `domain`'s descriptors built into `builder`
/// one top-level descriptor at a time, each message dropped once it is built, each with the
/// overlay's fields for it written in first (what they matched noted in `matched`).
fn add_config(
    builder: &mut Builder,
    resource: &str,
    domain: String,
    descriptors: impl Iterator<Item = Result<pb::RateLimitDescriptor, ConfigError>>,
    opts: LoadOptions,
    overlay: &Overlay,
    matched: &mut OverlayMatches,
) -> Result<(), ConfigError> {
    let mut open = builder.open_domain(resource, domain.clone(), opts)?;
    for d in descriptors {
        let mut raw = raw_descriptor(d?);
        overlay.apply(&domain, &mut raw, matched);
        open.add(raw)?;
    }
    builder.close_domain(open);
    Ok(())
}

/// The `RateLimitConfig` a resource carries, decoded whole.
pub fn decode_resource(any: &Any) -> Result<pb::RateLimitConfig, String> {
    pb::RateLimitConfig::decode(config_bytes(any.clone())?)
        .map_err(|e| format!("cannot decode RateLimitConfig: {e}"))
}

fn raw_descriptor(d: pb::RateLimitDescriptor) -> RawDescriptor {
    RawDescriptor {
        key: Some(d.key),
        value: Some(d.value),
        rate_limit: d.rate_limit.map(raw_limit),
        rate_limits: None,
        descriptors: if d.descriptors.is_empty() {
            None
        } else {
            Some(d.descriptors.into_iter().map(raw_descriptor).collect())
        },
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        value_to_metric: false,
        share_threshold: false,
        metadata: d.metadata.map(|s| struct_to_json(&s)),
    }
}

fn raw_limit(p: pb::RateLimitPolicy) -> RawRateLimit {
    // UNKNOWN is what an unset unit reads as, and an unlimited policy sets none.
    let unit = match pb::RateLimitUnit::try_from(p.unit) {
        Ok(pb::RateLimitUnit::Unknown) if p.unlimited => None,
        Ok(u) => Some(u.as_str_name().to_ascii_lowercase()),
        Err(_) => Some(p.unit.to_string()),
    };
    RawRateLimit {
        unit,
        requests_per_unit: Some(p.requests_per_unit),
        unlimited: p.unlimited,
        name: Some(p.name).filter(|n| !n.is_empty()),
        replaces: if p.replaces.is_empty() {
            None
        } else {
            Some(
                p.replaces
                    .into_iter()
                    .map(|r| RawReplaces { name: Some(r.name) })
                    .collect(),
            )
        },
        // Envoy Gateway's RateLimitConfig has no field for either.
        unit_multiplier: None,
        calendar: None,
        reserve: None,
        reserve_for: None,
        algorithm: None,
        burst: None,
        queue: None,
        local_first: None,
        overlaid: None,
    }
}

fn struct_to_json(s: &prost_types::Struct) -> serde_json::Map<String, serde_json::Value> {
    (s.fields.iter())
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect()
}

fn value_to_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    use serde_json::Value;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        // A number JSON cannot write (NaN, infinities) is null, as protobuf's JSON mapping has it.
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}
