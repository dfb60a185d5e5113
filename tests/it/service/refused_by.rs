//! A refusal names the limit that refused: in the answer's dynamic metadata (`refused_by`, with
//! `TURNSTILE_REFUSED_BY_METADATA=true`),
//! in the IETF `RateLimit-Policy` / `RateLimit` fields when the service-made headers are asked
//! for in that form, and in a debug log line, at most ten a second. Through Envoy's access log
//! in `envoy::access_log`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::Struct;

use crate::common::binary::{Server, BIN};
use crate::common::*;

const LIMITS: &str = "
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plan
    value: free
    rate_limit: {unit: hour, requests_per_unit: 1, name: free-tier}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: team
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {unit: day, requests_per_unit: 1}
";

/// `refused_by`'s fields as strings (numbers in their shortest form).
fn refused_by(md: &Struct) -> Vec<(String, String)> {
    let Some(Kind::StructValue(s)) = md.fields.get("refused_by").and_then(|v| v.kind.clone())
    else {
        panic!("no refused_by in {md:?}");
    };
    let mut out: Vec<(String, String)> = (s.fields.into_iter())
        .map(|(k, v)| {
            let text = match v.kind {
                Some(Kind::StringValue(s)) => s,
                Some(Kind::NumberValue(n)) => n.to_string(),
                Some(Kind::ListValue(l)) => format!(
                    "{:?}",
                    l.values
                        .iter()
                        .map(|v| match &v.kind {
                            Some(Kind::StringValue(s)) => s.clone(),
                            other => format!("{other:?}"),
                        })
                        .collect::<Vec<_>>()
                ),
                other => format!("{other:?}"),
            };
            (k, text)
        })
        .collect();
    out.sort();
    out
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = p
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

const ON: [(&str, &str); 1] = [("TURNSTILE_REFUSED_BY_METADATA", "true")];

#[tokio::test]
async fn a_refusal_names_its_limit_in_the_dynamic_metadata() {
    let s = TestServer::start_with(LIMITS, &ON).await;
    let two = || {
        req(
            "shop",
            vec![desc(&[("path", "/cart")]), desc(&[("api_key", "k1")])],
        )
    };
    let r = s.call(two()).await;
    assert_eq!(r.overall_code, OK);
    assert!(
        r.dynamic_metadata.is_none(),
        "nothing on an admitted call: {r:?}"
    );
    let r = s.call(two()).await;
    assert_eq!(r.overall_code, OVER);
    let md = r.dynamic_metadata.expect("a refusal carries refused_by");
    assert_eq!(
        refused_by(&md),
        pairs(&[
            ("limit", "shop.api_key"),
            ("domain", "shop"),
            ("descriptor", "1"),
            ("entries", "[\"api_key=k1\"]"),
            ("key", "shop_api_key_k1_"),
            ("requests_per_unit", "1"),
            ("unit", "MINUTE"),
        ])
    );
    assert_eq!(
        md.fields.len(),
        1,
        "the reference's layout only with RESPONSE_DYNAMIC_METADATA"
    );

    // A limit with a `name:` is named by it.
    s.call(one("shop", &[("plan", "free")])).await;
    let md = s
        .call(one("shop", &[("plan", "free")]))
        .await
        .dynamic_metadata
        .unwrap();
    assert!(
        refused_by(&md).contains(&("limit".into(), "free-tier".into())),
        "{md:?}"
    );

    // The second limit of a descriptor: its counter key carries its index, as its op's does.
    s.call(one("shop", &[("team", "a")])).await;
    let md = s
        .call(one("shop", &[("team", "a")]))
        .await
        .dynamic_metadata
        .unwrap();
    assert!(
        refused_by(&md).contains(&("key".into(), "shop_team_a_#1".into())),
        "{md:?}"
    );

    // Beside the reference's metadata, which stays as it is.
    let both = [ON[0], ("RESPONSE_DYNAMIC_METADATA", "true")];
    let m = TestServer::start_with(LIMITS, &both).await;
    m.call(one("shop", &[("api_key", "k2")])).await;
    let md = m
        .call(one("shop", &[("api_key", "k2")]))
        .await
        .dynamic_metadata
        .unwrap();
    let mut keys: Vec<&String> = md.fields.keys().collect();
    keys.sort();
    assert_eq!(keys, ["descriptors", "domain", "refused_by"]);

    // Off unless asked, so answers are the reference's byte for byte.
    let off = TestServer::start(LIMITS).await;
    off.call(one("shop", &[("api_key", "k3")])).await;
    let r = off.call(one("shop", &[("api_key", "k3")])).await;
    assert_eq!((r.overall_code, r.dynamic_metadata), (OVER, None));
}

/// A `Struct` as JSON, every number an `f64` (as [`numbers_as_f64`] makes them).
fn struct_json(s: &Struct) -> serde_json::Value {
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
        match &v.kind {
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::StructValue(s)) => struct_json(s),
            _ => serde_json::Value::Null,
        }
    }
    (s.fields.iter())
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn numbers_as_f64(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::Number(n) => serde_json::json!(n.as_f64().unwrap()),
        J::Array(a) => a.into_iter().map(numbers_as_f64).collect(),
        J::Object(o) => o.into_iter().map(|(k, v)| (k, numbers_as_f64(v))).collect(),
        v => v,
    }
}

/// `/json` answers what gRPC answers, dynamic metadata included, as envoyproxy/ratelimit's
/// `/json` marshals the whole `RateLimitResponse` (`NewJsonHandler`, protojson).
#[tokio::test]
async fn json_carries_the_dynamic_metadata_grpc_carries() {
    let both = [ON[0], ("RESPONSE_DYNAMIC_METADATA", "true")];
    let s = TestServer::start_with(LIMITS, &both).await;
    s.call(one("shop", &[("api_key", "k1")])).await;
    let grpc = s.call(one("shop", &[("api_key", "k1")])).await;
    assert_eq!(grpc.overall_code, OVER);
    let md = grpc
        .dynamic_metadata
        .expect("refused_by and the reference's fields");
    let body = serde_json::json!({
        "domain": "shop",
        "descriptors": [{"entries": [{"key": "api_key", "value": "k1"}]}],
    });
    let http = s.running().http_addr;
    let json = crate::common::envoy::post_json(http, &body).await;
    assert_eq!(json["overallCode"], "OVER_LIMIT", "{json}");
    assert_eq!(
        numbers_as_f64(json["dynamicMetadata"].clone()),
        struct_json(&md),
        "/json: {json}"
    );
    assert_eq!(
        json["dynamicMetadata"]["refused_by"]["requests_per_unit"],
        1
    );

    // An admitted answer with the reference's metadata carries it too.
    let json = crate::common::envoy::post_json(
        http,
        &serde_json::json!({
            "domain": "shop",
            "descriptors": [{"entries": [{"key": "path", "value": "/cart"}]}],
        }),
    )
    .await;
    assert_eq!(json["overallCode"], "OK", "{json}");
    assert_eq!(json["dynamicMetadata"]["domain"], "shop", "{json}");
}

/// draft-ietf-httpapi-ratelimit-headers-11: `RateLimit-Policy: "name";q=..;w=..` and
/// `RateLimit: "name";r=..;t=..`, for the limit that refused (or, admitted, the one nearest
/// its end).
#[tokio::test]
async fn the_ietf_fields_name_the_limit() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("TURNSTILE_RESPONSE_HEADERS", "ietf"),
    ];
    let s = TestServer::start_with(LIMITS, &env).await;
    let r = s.call(one("shop", &[("plan", "free")])).await;
    // T0 is 800 s into its hour.
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"free-tier\";q=1;w=3600")
    );
    assert_eq!(header(&r, "RateLimit"), Some("\"free-tier\";r=0;t=2800"));
    assert_eq!(header(&r, "RateLimit-Limit"), None, "one form at a time");
    let two = req(
        "shop",
        vec![desc(&[("path", "/p")]), desc(&[("api_key", "k")])],
    );
    s.call(two.clone()).await;
    let r = s.call(two).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"shop.api_key\";q=1;w=60")
    );
    assert_eq!(header(&r, "RateLimit"), Some("\"shop.api_key\";r=0;t=40"));
}

/// With `LOG_LEVEL=debug`, a refusal is logged with its domain, descriptor, limit and key; a
/// flood of refusals writes at most ten lines a second, the rest counted as `skipped`.
#[test]
fn refusals_are_logged_at_debug_at_most_ten_a_second() {
    let dir = crate::common::tempdir::TempDir::new("refusal-log");
    // A day's window: 200 calls in real time never see the window turn, as a minute's may.
    let day = LIMITS.replacen("{unit: minute,", "{unit: day,", 1);
    let config = dir.write("shop.yaml", &day);
    let server = Server::start(
        Path::new(BIN),
        &["serve", "--config", config.to_str().unwrap()],
        &[("LOG_LEVEL", "debug")],
    );
    let http = server.ports.http;
    let body =
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"api_key","value":"flood"}]}]}"#;
    let post = || {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-XPOST"])
            .arg(format!("http://{http}/json"))
            .args(["-d", body])
            .output()
            .unwrap()
    };
    assert_eq!(String::from_utf8_lossy(&post().stdout), "200");
    // 200 refusals as fast as one curl goes; then one more, a second later at least, to see
    // the count of the lines left out.
    let started = Instant::now();
    let mut refused = 0;
    while refused < 200 {
        assert_eq!(String::from_utf8_lossy(&post().stdout), "429");
        refused += 1;
    }
    std::thread::sleep(
        Duration::from_secs(1).saturating_sub(started.elapsed()) + Duration::from_millis(50),
    );
    post();
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = loop {
        let refusals: Vec<String> = (server.stderr().lines())
            .filter(|l| l.contains("request refused"))
            .map(str::to_owned)
            .collect();
        if refusals.iter().any(|l| !l.contains("skipped=0")) || Instant::now() > deadline {
            break refusals;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(server);
    let first = logged.first().expect("a refusal is logged");
    for want in [
        "domain=\"shop\"",
        "descriptor=api_key=flood",
        "limit=\"shop.api_key\"",
        "key=shop_api_key_flood_",
    ] {
        assert!(first.contains(want), "{want} not in {first}");
    }
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        (logged.len() as u64) <= 10 * seconds,
        "{} lines for 201 refusals in about {seconds} s",
        logged.len()
    );
    assert!(
        logged.iter().any(|l| !l.contains("skipped=0")),
        "the lines left out are counted: {logged:?}"
    );
}
