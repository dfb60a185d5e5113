//! Request limits over gRPC, at their exact boundaries: one past a limit is INVALID_ARGUMENT
//! naming the limit, the limit itself is decided, a refused request consumes nothing, and the
//! service keeps answering after every refusal.

use crate::common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use tonic::Code;
use turnstile::service::RequestLimits;

const CONFIG: &str = r#"
domain: hostile
descriptors:
  - key: probe
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

/// One call on the `probe` counter, which only good requests touch: the service answers, and its
/// remaining count shows exactly how many hits were taken before.
async fn probe(s: &TestServer) -> u32 {
    let r = s.call(one("hostile", &[("probe", "p")])).await;
    assert_eq!(r.overall_code, OK, "the service still decides");
    r.statuses[0].limit_remaining
}

/// `n` descriptors, each hitting the probe counter (so a wrongly decided request would show).
fn probes(n: usize) -> Vec<RateLimitDescriptor> {
    (0..n).map(|_| desc(&[("probe", "p")])).collect()
}

/// Puts a good descriptor before the bad one: a refused request must count none of it.
fn probe_first(mut r: RateLimitRequest) -> RateLimitRequest {
    r.descriptors.insert(0, desc(&[("probe", "p")]));
    r
}

fn entries(n: usize) -> RateLimitDescriptor {
    let pairs: Vec<(String, String)> = (0..n).map(|i| (format!("k{i}"), "v".into())).collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    desc(&refs)
}

/// The defaults the tests assert, so a change to them is a deliberate one.
#[test]
fn defaults_are_the_documented_ones() {
    let l = RequestLimits::default();
    assert_eq!(
        (
            l.max_descriptors,
            l.max_entries,
            l.max_key_len,
            l.max_value_len,
            l.max_message_bytes
        ),
        (64, 32, 256, 4096, 1 << 20)
    );
}

#[tokio::test]
async fn each_limit_is_enforced_at_its_boundary_and_named() {
    let s = TestServer::start(CONFIG).await;
    let mut remaining = probe(&s).await;
    let l = RequestLimits::default();

    // (over the limit, at the limit, what the message must say, hits the good one takes)
    let cases: Vec<(RateLimitRequest, RateLimitRequest, String, u32)> = vec![
        (
            req("hostile", probes(l.max_descriptors + 1)),
            req("hostile", probes(l.max_descriptors)),
            format!(
                "too many descriptors: {} (limit {})",
                l.max_descriptors + 1,
                l.max_descriptors
            ),
            l.max_descriptors as u32,
        ),
        (
            probe_first(req("hostile", vec![entries(l.max_entries + 1)])),
            req("hostile", vec![entries(l.max_entries)]),
            format!(
                "descriptors[1] has too many entries: {} (limit {})",
                l.max_entries + 1,
                l.max_entries
            ),
            0,
        ),
        (
            probe_first(one("hostile", &[(&"k".repeat(l.max_key_len + 1), "v")])),
            one("hostile", &[(&"k".repeat(l.max_key_len), "v")]),
            format!(
                "descriptors[1].entries[0].key is {} bytes (limit {})",
                l.max_key_len + 1,
                l.max_key_len
            ),
            0,
        ),
        (
            probe_first(one(
                "hostile",
                &[("probe", &"v".repeat(l.max_value_len + 1))],
            )),
            one("hostile", &[("probe", &"v".repeat(l.max_value_len))]),
            format!(
                "descriptors[1].entries[0].value is {} bytes (limit {})",
                l.max_value_len + 1,
                l.max_value_len
            ),
            0, // a different value is a different counter
        ),
    ];
    for (over, at, message, hits) in cases {
        let e = s.try_call(over).await.expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{message}");
        assert!(
            e.message().contains(&message),
            "{:?} should contain {message:?}",
            e.message()
        );
        assert_eq!(probe(&s).await, remaining - 1, "refused consumed nothing");
        remaining -= 1;

        let r = s.try_call(at).await.expect("at the limit is decided");
        assert_eq!(r.overall_code, OK);
        remaining -= hits;
        assert_eq!(probe(&s).await, remaining - 1, "after {message}");
        remaining -= 1;
    }
}

#[tokio::test]
async fn an_oversized_message_is_refused_by_the_transport_and_the_service_keeps_answering() {
    let s = TestServer::start(CONFIG).await;
    let max = RequestLimits::default().max_message_bytes;
    // An unknown domain limits nothing, so the values' bytes set the message size exactly:
    // `len` bytes in values of at most 4 096 bytes (each within the bounds every door keeps),
    // 32 to a descriptor.
    let sized = |len: usize| {
        let values: Vec<String> = (0..len.div_ceil(4096))
            .map(|i| "v".repeat((len - i * 4096).min(4096)))
            .collect();
        let descriptors = (values.chunks(32))
            .map(|chunk| {
                let pairs: Vec<(&str, &str)> = chunk.iter().map(|v| ("k", v.as_str())).collect();
                desc(&pairs)
            })
            .collect();
        req("d", descriptors)
    };
    // Each entry adds a few bytes of framing; step to the longest that still encodes to `max`.
    let mut len = max;
    for _ in 0..20 {
        let over = sized(len).encoded_len() as i64 - max as i64;
        if over <= 0 {
            break;
        }
        len -= over as usize;
    }
    while sized(len + 1).encoded_len() <= max {
        len += 1;
    }
    assert_eq!(sized(len).encoded_len(), max);

    let r = s.try_call(sized(len)).await.expect("exactly the limit");
    assert_eq!(r.overall_code, OK);

    let before = probe(&s).await;
    let e = s.try_call(sized(len + 1)).await.expect_err("one byte over");
    // tonic refuses while decoding, before the handler runs; turnstile answers INVALID_ARGUMENT.
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("message length too large"),
        "{:?}",
        e.message()
    );
    // The same connection still works, and so does a new one; nothing was counted.
    assert_eq!(probe(&s).await, before - 1);
    let mut fresh = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", s.running().grpc_addr),
    )
    .await
    .expect("new connection");
    let r = fresh
        .should_rate_limit(one("hostile", &[("probe", "p")]))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, before - 2);

    // Far over the limit (8 MiB) is refused the same way.
    let e = s
        .try_call(sized(8 << 20))
        .await
        .expect_err("far over the limit");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(probe(&s).await, before - 3);
}

#[tokio::test]
async fn json_endpoint_applies_the_same_limits() {
    let s = TestServer::start(CONFIG).await;
    let l = RequestLimits::default();
    let body = serde_json::json!({
        "domain": "hostile",
        "descriptors": (0..=l.max_descriptors)
            .map(|_| serde_json::json!({"entries": [{"key": "probe", "value": "p"}]}))
            .collect::<Vec<_>>(),
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/json", s.http))
        .json(&body)
        .send()
        .await
        .expect("HTTP answers");
    assert_eq!(resp.status(), 400);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains(&format!("limit {}", l.max_descriptors)),
        "{text}"
    );
    assert_eq!(probe(&s).await, 999, "the refused request consumed nothing");
}

/// Sends bytes as they are, as a broken or hostile client might.
#[derive(Clone, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Bytes that are not a `RateLimitRequest` are the client's fault: INVALID_ARGUMENT naming
/// what is wrong, never INTERNAL; nothing is counted and the service keeps answering.
#[tokio::test]
async fn bytes_that_do_not_decode_get_invalid_argument() {
    let s = TestServer::start(CONFIG).await;
    let before = probe(&s).await;
    let whole = one("hostile", &[("probe", "p")]).encode_to_vec();
    let mut not_utf8 = one("hostile", &[("probe", "\u{1}")]).encode_to_vec();
    let at = not_utf8
        .iter()
        .rposition(|b| *b == 1)
        .expect("the value byte");
    not_utf8[at] = 0xff;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", s.running().grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    for (what, bytes, needle) in [
        ("garbage", vec![0xffu8; 11], "invalid varint"),
        ("cut in half", whole[..whole.len() / 2].to_vec(), "decode"),
        ("a value that is not UTF-8", not_utf8, "UTF-8"),
    ] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        );
        let e = grpc
            .unary(tonic::Request::new(bytes), path, RawCodec)
            .await
            .expect_err(what);
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains(needle), "{what}: {:?}", e.message());
    }
    assert_eq!(probe(&s).await, before - 1, "nothing was counted");
}
