//! The JSON form of `RateLimitRequest`/`RateLimitResponse` for `POST /json`, following the proto3
//! JSON mapping (lowerCamelCase names, the original snake_case names accepted too).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value as PbValue};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<StringOrNumber>,
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requestsPerUnit")]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Value,
}

/// proto3 JSON writes 64-bit integers as strings; accept both.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringOrNumber {
    N(u64),
    S(String),
}

impl JsonRequest {
    pub fn into_proto(self) -> Result<RateLimitRequest, String> {
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for (i, d) in self.descriptors.into_iter().enumerate() {
            let hits_addend = match d.hits_addend {
                None => None,
                Some(StringOrNumber::N(n)) => Some(n),
                Some(StringOrNumber::S(s)) => Some(s.parse().map_err(|_| {
                    format!("descriptors[{i}].hits_addend \"{s}\" is not a number")
                })?),
            };
            let limit = match d.limit {
                None => None,
                Some(l) => Some(RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: unit_number(&l.unit)
                        .ok_or_else(|| format!("descriptors[{i}].limit.unit is not a unit"))?,
                }),
            };
            descriptors.push(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: hits_addend
                    .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                is_negative_hits: d.is_negative_hits,
            });
        }
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: self.hits_addend,
        })
    }
}

fn unit_number(v: &Value) -> Option<i32> {
    match v {
        Value::Number(n) => n.as_i64().map(|n| n as i32),
        Value::String(s) => Some(match s.to_ascii_uppercase().as_str() {
            "UNKNOWN" => 0,
            "SECOND" => 1,
            "MINUTE" => 2,
            "HOUR" => 3,
            "DAY" => 4,
            "MONTH" => 5,
            "YEAR" => 6,
            _ => return None,
        }),
        Value::Null => Some(0),
        _ => None,
    }
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn unit_name(unit: i32) -> &'static str {
    match unit {
        1 => "SECOND",
        2 => "MINUTE",
        3 => "HOUR",
        4 => "DAY",
        5 => "MONTH",
        6 => "YEAR",
        7 => "WEEK",
        _ => "UNKNOWN",
    }
}

/// The response in proto3 JSON form.
pub fn response_json(r: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut o = serde_json::Map::new();
            o.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut cl = serde_json::Map::new();
                if !l.name.is_empty() {
                    cl.insert("name".into(), json!(l.name));
                }
                cl.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                cl.insert("unit".into(), json!(unit_name(l.unit)));
                o.insert("currentLimit".into(), Value::Object(cl));
            }
            if s.limit_remaining > 0 {
                o.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                o.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(o)
        })
        .collect();
    let headers: Vec<Value> = r
        .response_headers_to_add
        .iter()
        .map(|h| json!({"key": h.key, "value": h.value}))
        .collect();
    let request_headers: Vec<Value> = (r.request_headers_to_add.iter())
        .map(|h| json!({"key": h.key, "value": h.value}))
        .collect();
    let mut o = serde_json::Map::new();
    o.insert("overallCode".into(), json!(code_name(r.overall_code)));
    o.insert("statuses".into(), Value::Array(statuses));
    if !headers.is_empty() {
        o.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if !request_headers.is_empty() {
        o.insert("requestHeadersToAdd".into(), Value::Array(request_headers));
    }
    if let Some(md) = &r.dynamic_metadata {
        o.insert("dynamicMetadata".into(), struct_json(md));
    }
    Value::Object(o)
}

/// A `google.protobuf.Struct` as proto3 JSON writes it: a plain object.
fn struct_json(s: &Struct) -> Value {
    Value::Object(
        (s.fields.iter())
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        // A whole number is written without a fraction, as Go's protojson writes it.
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 => {
            json!(*n as i64)
        }
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

#[derive(Serialize)]
pub struct JsonError {
    pub error: String,
}
