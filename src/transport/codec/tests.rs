use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::google::protobuf::{Duration, Struct, Value};
use proptest::prelude::*;

use super::*;

fn status() -> impl Strategy<Value = DescriptorStatus> {
    // Unnamed limits (most configs) are written on the stack, named ones straight out.
    let name = prop_oneof![Just(String::new()), ".{1,40}"];
    let limit = (any::<u32>(), -2i32..8, name).prop_map(|(rpu, unit, name)| RateLimit {
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

fn request() -> impl Strategy<Value = RateLimitRequest> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::google::protobuf::UInt64Value;
    let entry = (".{0,12}", ".{0,300}").prop_map(|(key, value)| PbEntry { key, value });
    let limit = (any::<u32>(), -2i32..8).prop_map(|(requests_per_unit, unit)| RateLimitOverride {
        requests_per_unit,
        unit,
    });
    let descriptor = (
        proptest::collection::vec(entry, 0..5),
        proptest::option::of(limit),
        proptest::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(
            |(entries, limit, hits, is_negative_hits)| RateLimitDescriptor {
                entries,
                limit,
                hits_addend: hits.map(|value| UInt64Value { value }),
                is_negative_hits,
            },
        );
    (
        ".{0,20}",
        proptest::collection::vec(descriptor, 0..6),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #[test]
    fn reads_any_request_as_prost_decodes_it(r in request()) {
        let bytes = r.encode_to_vec();
        prop_assert_eq!(read_request(&bytes), Some(Request::of(&r)));
    }
}

fn field(tag: u32, wire: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint(u64::from(tag << 3 | wire), &mut out);
    if wire == 2 {
        encode_varint(body.len() as u64, &mut out);
    }
    out.extend_from_slice(body);
    out
}

#[test]
fn unknown_fields_are_skipped_and_the_last_of_a_scalar_wins() {
    let mut b = field(1, 2, b"first");
    b.extend(field(9, 0, &[0x96, 0x01]));
    b.extend(field(10, 2, b"whatever"));
    b.extend(field(11, 5, &[1, 2, 3, 4]));
    b.extend(field(12, 1, &[1, 2, 3, 4, 5, 6, 7, 8]));
    b.extend(field(1, 2, b"second"));
    b.extend(field(3, 0, &[7]));
    let prost = RateLimitRequest::decode(&b[..]).expect("prost decodes it");
    assert_eq!(prost.domain, "second");
    assert_eq!(read_request(&b), Some(Request::of(&prost)));
}

/// Protobuf merges a message field sent twice; the reader leaves that to prost, and the
/// adapter answers what prost decodes.
#[test]
fn a_limit_sent_twice_is_left_to_prost() {
    let limit = |body: &[u8]| field(2, 2, body);
    let mut d = field(1, 2, &[field(1, 2, b"k"), field(2, 2, b"v")].concat());
    d.extend(limit(&[8, 5]));
    d.extend(limit(&[16, 2]));
    let b = field(2, 2, &d);
    assert_eq!(read_request(&b), None);
    let prost = decode_request(&b).expect("prost merges the two");
    let l = prost.descriptors[0].limit.expect("a limit");
    assert_eq!((l.requests_per_unit, l.unit), (5, 2));
}

/// Whatever prost refuses, the reader refuses, and prost's error is the answer: it names
/// the field.
#[test]
fn bytes_prost_refuses_are_refused_with_prost_s_error() {
    let not_utf8 = field(2, 2, &field(1, 2, &field(2, 2, &[0xff])));
    let wrong_wire = field(1, 0, &[1]);
    let cut = &field(1, 2, b"domain")[..4];
    for (bytes, needle) in [
        (&not_utf8[..], "Entry.value"),
        (&wrong_wire[..], "invalid wire type"),
        (cut, "buffer underflow"),
        (&[0xff; 11][..], "invalid varint"),
        (&[0x00][..], "invalid tag value: 0"),
    ] {
        assert_eq!(read_request(bytes), None, "{needle}");
        let e = decode_request(bytes).expect_err(needle);
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(
            e.message().contains("failed to decode Protobuf message"),
            "{e:?}"
        );
        assert!(e.message().contains(needle), "{needle}: {e:?}");
    }
}
