//! Arbitrary bytes → turnstile's request reader (`transport::codec::read_request`), against
//! prost: whatever the reader takes, prost decodes too, into the same request; whatever prost
//! refuses, the reader refuses (so the gRPC adapter, which hands what the reader does not take
//! to prost, answers prost's error).
#![no_main]

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use turnstile::service::Request;
use turnstile::transport::codec::read_request;

fuzz_target!(|data: &[u8]| {
    let decoded = RateLimitRequest::decode(data);
    match (read_request(data), &decoded) {
        (Some(read), Ok(d)) => assert_eq!(read, Request::of(d)),
        (Some(read), Err(e)) => panic!("read {read:?} where prost refuses: {e}"),
        (None, _) => {}
    }
    // A request prost encodes is always taken.
    if let Ok(d) = decoded {
        let bytes = d.encode_to_vec();
        assert_eq!(read_request(&bytes), Some(Request::of(&d)));
    }
});
