//! The `ShouldRateLimit` codec: prost's decoder for the request (its size limit and its errors
//! unchanged), and an encoder that writes the answer in one pass.
//!
//! prost's derived encoder works out a nested message's length again at every level it is
//! written from: an answer's statuses and their limits are measured three times before a byte
//! is written. This one measures each once, and writes the same bytes (a property test holds it
//! to prost's output for any answer).

use bytes::BufMut;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, message, WireType};
use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstCodec;

/// The codec of the `ShouldRateLimit` method.
#[derive(Debug, Clone, Copy, Default)]
pub struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = AnswerEncoder;
    type Decoder = <ProstCodec<RateLimitResponse, RateLimitRequest> as Codec>::Decoder;

    fn encoder(&mut self) -> AnswerEncoder {
        AnswerEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<RateLimitResponse, RateLimitRequest>::default().decoder()
    }
}

/// Writes a [`RateLimitResponse`] as prost would, in one pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnswerEncoder;

impl Encoder for AnswerEncoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: RateLimitResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_response(&item, dst);
        Ok(())
    }
}

/// Writes `r` in prost's encoding: fields in tag order, defaults left out.
pub fn encode_response(r: &RateLimitResponse, buf: &mut impl BufMut) {
    varint_field(1, r.overall_code as u64, buf);
    for s in &r.statuses {
        encode_status(s, buf);
    }
    for h in &r.response_headers_to_add {
        message::encode(3, h, buf);
    }
    for h in &r.request_headers_to_add {
        message::encode(4, h, buf);
    }
    if !r.raw_body.is_empty() {
        prost::encoding::bytes::encode(5, &r.raw_body, buf);
    }
    if let Some(m) = &r.dynamic_metadata {
        message::encode(6, m, buf);
    }
    if let Some(q) = &r.quota {
        message::encode(7, q, buf);
    }
}

/// A status as field 2 of the answer.
fn encode_status(s: &DescriptorStatus, buf: &mut impl BufMut) {
    let limit_len = s.current_limit.as_ref().map(limit_body_len);
    let reset_len = s.duration_until_reset.as_ref().map(Message::encoded_len);
    let quota_len = s.quota.as_ref().map(Message::encoded_len);
    let len = varint_field_len(s.code as u64)
        + limit_len.map_or(0, nested_len)
        + varint_field_len(u64::from(s.limit_remaining))
        + reset_len.map_or(0, nested_len)
        + quota_len.map_or(0, nested_len);
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
    varint_field(1, s.code as u64, buf);
    if let (Some(l), Some(n)) = (&s.current_limit, limit_len) {
        encode_key(2, WireType::LengthDelimited, buf);
        encode_varint(n as u64, buf);
        varint_field(1, u64::from(l.requests_per_unit), buf);
        varint_field(2, l.unit as u64, buf);
        if !l.name.is_empty() {
            encode_key(3, WireType::LengthDelimited, buf);
            encode_varint(l.name.len() as u64, buf);
            buf.put_slice(l.name.as_bytes());
        }
    }
    varint_field(3, u64::from(s.limit_remaining), buf);
    if let (Some(d), Some(n)) = (&s.duration_until_reset, reset_len) {
        encode_key(4, WireType::LengthDelimited, buf);
        encode_varint(n as u64, buf);
        d.encode_raw(buf);
    }
    if let (Some(q), Some(n)) = (&s.quota, quota_len) {
        encode_key(5, WireType::LengthDelimited, buf);
        encode_varint(n as u64, buf);
        q.encode_raw(buf);
    }
}

fn limit_body_len(l: &RateLimit) -> usize {
    let name = if l.name.is_empty() {
        0
    } else {
        1 + encoded_len_varint(l.name.len() as u64) + l.name.len()
    };
    varint_field_len(u64::from(l.requests_per_unit)) + varint_field_len(l.unit as u64) + name
}

/// A varint field (an `int32` or enum as prost writes it: negatives as ten bytes), left out
/// when zero. Every tag here is below 16, so its key is one byte.
#[inline]
fn varint_field(tag: u8, v: u64, buf: &mut impl BufMut) {
    if v != 0 {
        buf.put_u8(tag << 3);
        encode_varint(v, buf);
    }
}

#[inline]
fn varint_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + encoded_len_varint(v)
    }
}

/// A length-delimited field of `n` bytes, with its one-byte key and its length.
#[inline]
fn nested_len(n: usize) -> usize {
    1 + encoded_len_varint(n as u64) + n
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::google::protobuf::{Duration, Struct, Value};
    use proptest::prelude::*;

    use super::*;

    fn status() -> impl Strategy<Value = DescriptorStatus> {
        let limit = (any::<u32>(), -2i32..8, ".{0,40}").prop_map(|(rpu, unit, name)| RateLimit {
            name,
            requests_per_unit: rpu,
            unit,
        });
        let reset =
            (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| Duration { seconds, nanos });
        (
            -1i32..3,
            proptest::option::of(limit),
            any::<u32>(),
            proptest::option::of(reset),
        )
            .prop_map(
                |(code, current_limit, limit_remaining, duration_until_reset)| DescriptorStatus {
                    code,
                    current_limit,
                    limit_remaining,
                    duration_until_reset,
                    quota: None,
                },
            )
    }

    fn response() -> impl Strategy<Value = RateLimitResponse> {
        (
            -1i32..3,
            proptest::collection::vec(status(), 0..6),
            proptest::collection::vec(("[a-z-]{0,12}", ".{0,20}"), 0..3),
            proptest::collection::vec(any::<u8>(), 0..4),
            any::<bool>(),
        )
            .prop_map(|(overall_code, statuses, headers, raw_body, metadata)| {
                let headers: Vec<HeaderValue> = headers
                    .into_iter()
                    .map(|(key, value)| HeaderValue {
                        key,
                        value,
                        ..Default::default()
                    })
                    .collect();
                RateLimitResponse {
                    overall_code,
                    statuses,
                    request_headers_to_add: headers.clone(),
                    response_headers_to_add: headers,
                    raw_body,
                    dynamic_metadata: metadata.then(|| Struct {
                        fields: [("domain".to_owned(), Value::default())].into(),
                    }),
                    ..Default::default()
                }
            })
    }

    proptest! {
        #[test]
        fn writes_what_prost_writes(r in response()) {
            let mut ours = Vec::new();
            encode_response(&r, &mut ours);
            prop_assert_eq!(ours, r.encode_to_vec());
        }
    }

    #[test]
    fn a_status_with_a_quota_is_written_as_prost_writes_it() {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Quota;
        let r = RateLimitResponse {
            statuses: vec![DescriptorStatus {
                code: 1,
                quota: Some(Quota {
                    requests: 7,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut ours = Vec::new();
        encode_response(&r, &mut ours);
        assert_eq!(ours, r.encode_to_vec());
    }
}
