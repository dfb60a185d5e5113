//! Arbitrary bytes → a `RateLimitResponse` (where prost decodes them) → turnstile's one-pass
//! answer encoder (`transport::codec`): it must write exactly the bytes prost writes for the
//! same answer, whatever the answer holds.
#![no_main]

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use turnstile::transport::codec::encode_response;

fuzz_target!(|data: &[u8]| {
    let Ok(answer) = RateLimitResponse::decode(data) else {
        return;
    };
    let mut ours = Vec::new();
    encode_response(&answer, &mut ours);
    assert_eq!(ours, answer.encode_to_vec());
});
