//! A `ShouldRateLimit` request as the service reads it, and its bounds. A request is borrowed,
//! never copied: the gRPC adapter reads one straight from the call's protobuf bytes; everyone
//! else borrows a decoded `RateLimitRequest` ([`Request::of`]). The bounds keep a hostile or
//! broken client from making the service do unbounded work; bad input gets INVALID_ARGUMENT
//! naming what is wrong.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use smallvec::SmallVec;

use super::RlsError;
use crate::descriptor::Entry;

/// A request: the fields of `RateLimitRequest` the service reads, borrowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub descriptors: SmallVec<[Descriptor<'a>; 4]>,
    /// The request's `hits_addend` (0 means 1).
    pub hits_addend: u32,
}

/// One descriptor of a [`Request`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    pub entries: SmallVec<[Entry<'a>; 4]>,
    /// Envoy's `limit` override.
    pub limit: Option<Override>,
    /// The descriptor's own `hits_addend`, when set (usage reported after the fact).
    pub hits_addend: Option<u64>,
    pub is_negative_hits: bool,
}

/// Envoy's per-descriptor `limit` override, as sent: `unit` is the protobuf enum's number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Override {
    pub requests_per_unit: u32,
    pub unit: i32,
}

impl<'a> Request<'a> {
    /// Borrows a decoded request.
    pub fn of(req: &'a RateLimitRequest) -> Request<'a> {
        Request {
            domain: &req.domain,
            descriptors: req.descriptors.iter().map(Descriptor::of).collect(),
            hits_addend: req.hits_addend,
        }
    }
}

impl<'a> Descriptor<'a> {
    /// Borrows a decoded descriptor.
    pub fn of(d: &'a RateLimitDescriptor) -> Descriptor<'a> {
        Descriptor {
            entries: d.entries.iter().map(Entry::from).collect(),
            limit: d.limit.map(|l| Override {
                requests_per_unit: l.requests_per_unit,
                unit: l.unit,
            }),
            hits_addend: d.hits_addend.map(|h| h.value),
            is_negative_hits: d.is_negative_hits,
        }
    }
}

/// Bounds on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_len: usize,
    pub max_value_len: usize,
    pub max_message_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_key_len: 256,
            max_value_len: 4096,
            max_message_bytes: 1 << 20,
        }
    }
}

/// Bad input gets INVALID_ARGUMENT naming what is wrong: what Envoy's door refuses (an empty
/// domain, descriptor, entry or key), then the bounds every door keeps ([`within_bounds`]).
pub fn validate(req: &Request<'_>, limits: &RequestLimits) -> Result<(), RlsError> {
    let bad = |m: String| Err(RlsError::InvalidArgument(m));
    if req.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return bad(format!("descriptors[{i}] has no entries"));
        }
        if let Some(j) = d.entries.iter().position(|e| e.key.is_empty()) {
            return bad(format!(
                "descriptors[{i}].entries[{j}].key must not be empty"
            ));
        }
    }
    let descriptors = req.descriptors.iter().map(|d| d.entries.as_slice());
    within_bounds(req.domain, descriptors, limits)
}

/// The bounds every door keeps on what a caller sends, whatever its protocol: how many
/// descriptors and entries, and the bytes of the domain (a namespace, a key's prefix), of each
/// key and of each value, so what a caller can add to what is kept (counters, series, logs) is
/// bounded in bytes as well as in count. INVALID_ARGUMENT naming the field and the bound.
pub fn within_bounds<'a>(
    domain: &str,
    descriptors: impl ExactSizeIterator<Item = &'a [Entry<'a>]>,
    limits: &RequestLimits,
) -> Result<(), RlsError> {
    let bad = |m: String| Err(RlsError::InvalidArgument(m));
    if domain.len() > limits.max_value_len {
        return bad(format!(
            "domain is {} bytes (limit {})",
            domain.len(),
            limits.max_value_len
        ));
    }
    if descriptors.len() > limits.max_descriptors {
        return bad(format!(
            "too many descriptors: {} (limit {})",
            descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (i, entries) in descriptors.enumerate() {
        if entries.len() > limits.max_entries {
            return bad(format!(
                "descriptors[{i}] has too many entries: {} (limit {})",
                entries.len(),
                limits.max_entries
            ));
        }
        for (j, e) in entries.iter().enumerate() {
            if e.key.len() > limits.max_key_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key is {} bytes (limit {})",
                    e.key.len(),
                    limits.max_key_len
                ));
            }
            if e.value.len() > limits.max_value_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].value is {} bytes (limit {})",
                    e.value.len(),
                    limits.max_value_len
                ));
            }
        }
    }
    Ok(())
}
