//! The `ShouldRateLimit` codec. The request is read where it lies: [`read_request`] borrows its
//! strings from the call's bytes, and anything it does not take goes to prost, whose answer (an
//! error included, with tonic's status and message) is the one given. The answer is written in
//! one pass.
//!
//! prost's derived encoder works out a nested message's length again at every level it is
//! written from: an answer's statuses and their limits are measured three times before a byte
//! is written. This one measures each once, and writes the same bytes (a property test holds it
//! to prost's output for any answer).

use bytes::{Buf, BufMut, Bytes};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, message, WireType};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::descriptor::Entry;
use crate::service::{Descriptor, Override, Request};

/// The codec of the `ShouldRateLimit` method: the request's bytes as they came (tonic has
/// checked their size), and the answer written in one pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = Bytes;
    type Encoder = AnswerEncoder;
    type Decoder = RequestBytes;

    fn encoder(&mut self) -> AnswerEncoder {
        AnswerEncoder
    }

    fn decoder(&mut self) -> RequestBytes {
        RequestBytes
    }
}

/// Hands the request's bytes on as they are (no copy: tonic's buffer is split off).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestBytes;

impl Decoder for RequestBytes {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Decodes `bytes` with prost, for what [`read_request`] does not take: its error is the one
/// tonic's prost codec gives (INTERNAL, the message naming the field), which the per-call
/// layer answers as INVALID_ARGUMENT.
pub fn decode_request(bytes: &[u8]) -> Result<RateLimitRequest, Status> {
    RateLimitRequest::decode(bytes).map_err(|e| Status::internal(e.to_string()))
}

/// Reads a `RateLimitRequest` from its protobuf bytes, borrowing its strings. `None` for bytes
/// prost would refuse, and for what protobuf allows but Envoy never sends and prost handles
/// (a descriptor's `limit` or `hits_addend` sent twice, which merge; groups): both go to
/// [`decode_request`]. What it takes, it reads as prost would (a fuzz target holds it to that):
/// unknown fields skipped, the last of a repeated scalar wins.
pub fn read_request(bytes: &[u8]) -> Option<Request<'_>> {
    let mut r = Reader(bytes);
    let mut req = Request::default();
    while let Some((tag, wire)) = r.key()? {
        match (tag, wire) {
            (1, LEN) => req.domain = r.str()?,
            (2, LEN) => req.descriptors.push(descriptor(r.bytes()?)?),
            (3, VARINT) => req.hits_addend = r.varint()? as u32,
            (1..=3, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some(req)
}

fn descriptor(bytes: &[u8]) -> Option<Descriptor<'_>> {
    let mut r = Reader(bytes);
    let mut d = Descriptor::default();
    while let Some((tag, wire)) = r.key()? {
        match (tag, wire) {
            (1, LEN) => d.entries.push(entry(r.bytes()?)?),
            (2, LEN) if d.limit.is_none() => d.limit = Some(limit(r.bytes()?)?),
            (3, LEN) if d.hits_addend.is_none() => d.hits_addend = Some(u64_value(r.bytes()?)?),
            (4, VARINT) => d.is_negative_hits = r.varint()? != 0,
            (1..=4, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some(d)
}

fn entry(bytes: &[u8]) -> Option<Entry<'_>> {
    let mut r = Reader(bytes);
    let mut e = Entry::default();
    while let Some((tag, wire)) = r.key()? {
        match (tag, wire) {
            (1, LEN) => e.key = r.str()?,
            (2, LEN) => e.value = r.str()?,
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some(e)
}

fn limit(bytes: &[u8]) -> Option<Override> {
    let mut r = Reader(bytes);
    let mut l = Override::default();
    while let Some((tag, wire)) = r.key()? {
        match (tag, wire) {
            (1, VARINT) => l.requests_per_unit = r.varint()? as u32,
            (2, VARINT) => l.unit = r.varint()? as i32,
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some(l)
}

/// A `google.protobuf.UInt64Value`.
fn u64_value(bytes: &[u8]) -> Option<u64> {
    let mut r = Reader(bytes);
    let mut v = 0;
    while let Some((tag, wire)) = r.key()? {
        match (tag, wire) {
            (1, VARINT) => v = r.varint()?,
            (1, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some(v)
}

const VARINT: u8 = 0;
const LEN: u8 = 2;

/// The bytes of one message not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The next field's tag and wire type; `Some(None)` at the end of the message.
    #[inline]
    fn key(&mut self) -> Option<Option<(u32, u8)>> {
        if self.0.is_empty() {
            return Some(None);
        }
        let key = u32::try_from(self.varint()?).ok()?;
        let tag = key >> 3;
        if tag == 0 {
            return None;
        }
        Some(Some((tag, (key & 7) as u8)))
    }

    /// A varint of at most ten bytes, the tenth at most 1 (as prost reads them).
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            if i == 9 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.0 = &self.0[i + 1..];
                return Some(v);
            }
        }
        None
    }

    #[inline]
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        if n > self.0.len() {
            return None;
        }
        let (field, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(field)
    }

    #[inline]
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    /// Skips a field of an unknown tag; groups are left to prost.
    fn skip(&mut self, wire: u8) -> Option<()> {
        let n = match wire {
            VARINT => return self.varint().map(drop),
            1 => 8,
            LEN => return self.bytes().map(drop),
            5 => 4,
            _ => return None,
        };
        self.0 = self.0.get(n..)?;
        Some(())
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
///
/// A status without a limit name or a quota (most configs name no limit) is written on the
/// stack first and put in `buf` with one copy: tonic's buffer checks its capacity for every
/// byte put into it. Such a status is at most 62 bytes: its key and length 2, the code 11, the
/// limit 19, the remaining count 6, the reset 24.
fn encode_status(s: &DescriptorStatus, buf: &mut impl BufMut) {
    let unnamed = s.current_limit.as_ref().is_none_or(|l| l.name.is_empty());
    if unnamed && s.quota.is_none() {
        let mut bytes = [0u8; 64];
        let mut rest = &mut bytes[..];
        write_status(s, &mut rest);
        let written = 64 - rest.len();
        buf.put_slice(&bytes[..written]);
    } else {
        write_status(s, buf);
    }
}

fn write_status(s: &DescriptorStatus, buf: &mut impl BufMut) {
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
mod tests;
