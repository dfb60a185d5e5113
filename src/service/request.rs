//! A `ShouldRateLimit` request as the service reads it: borrowed, never copied. The gRPC
//! adapter reads one straight from the call's protobuf bytes; everyone else borrows a decoded
//! `RateLimitRequest` ([`Request::of`]).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use smallvec::SmallVec;

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
