//! The Envoy rate-limit service over gRPC: the answers envoyproxy/ratelimit gives, from its config.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tonic::Code;

use crate::common::*;

#[tokio::test]
async fn exact_beats_wildcard_beats_key_only_and_first_wildcard_wins() {
    let s = TestServer::start(EDGE).await;
    let rpu = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit))
    };
    assert_eq!(
        rpu(&s.call(one("edge", &[("api_key", "vip")])).await),
        Some((100, 3))
    );
    assert_eq!(
        rpu(&s.call(one("edge", &[("api_key", "x")])).await),
        Some((3, 2))
    );
    assert_eq!(
        rpu(&s.call(one("edge", &[("path", "/api/v1/users/7")])).await),
        Some((2, 2))
    );
    assert_eq!(
        rpu(&s.call(one("edge", &[("path", "/api/v1/orders")])).await),
        Some((5, 2))
    );
    assert_eq!(
        rpu(&s.call(one("edge", &[("path", "/other")])).await),
        None,
        "no match, no limit"
    );
    assert_eq!(
        rpu(&s.call(one("edge", &[("weekly", "w")])).await),
        Some((1, 7)),
        "WEEK"
    );
}

#[tokio::test]
async fn nested_descriptors_follow_the_depth_rule() {
    let s = TestServer::start(EDGE).await;
    let nested = s
        .call(one(
            "edge",
            &[("remote_address", "10.0.0.1"), ("path", "/x")],
        ))
        .await;
    assert_eq!(codes(&nested), vec![(OK, 0)]);
    assert!(nested.statuses[0].current_limit.is_some());
    let again = s
        .call(one(
            "edge",
            &[("remote_address", "10.0.0.1"), ("path", "/x")],
        ))
        .await;
    assert_eq!(again.overall_code, OVER);
    // Shallower than the config: the parent has no limit of its own, and no fallback applies.
    let shallow = s.call(one("edge", &[("remote_address", "10.0.0.1")])).await;
    assert_eq!(
        (
            shallow.overall_code,
            shallow.statuses[0].current_limit.is_none()
        ),
        (OK, true)
    );
    // Deeper than the config.
    let deep = s
        .call(one("edge", &[("api_key", "a"), ("path", "/x")]))
        .await;
    assert!(deep.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn unlimited_whitelisted_blocked_and_unknown_domain() {
    let s = TestServer::start(EDGE).await;
    let r = s.call(one("edge", &[("free", "x")])).await;
    assert_eq!(codes(&r), vec![(OK, u32::MAX)]);
    assert!(r.statuses[0].current_limit.is_none());
    let r = s.call(one("edge", &[("allowlisted", "x")])).await;
    assert_eq!(
        (codes(&r), r.statuses[0].current_limit.is_none()),
        (vec![(OK, 0)], true)
    );
    assert_eq!(
        s.call(one("edge", &[("blocked", "x")])).await.overall_code,
        OVER
    );
    let r = s.call(one("nowhere", &[("api_key", "x")])).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
}

#[tokio::test]
async fn share_threshold_gives_all_matching_values_one_counter() {
    let s = TestServer::start(EDGE).await;
    assert_eq!(
        s.call(one("edge", &[("tenant", "t-1")])).await.overall_code,
        OK
    );
    assert_eq!(
        s.call(one("edge", &[("tenant", "t-2")])).await.overall_code,
        OK
    );
    assert_eq!(
        s.call(one("edge", &[("tenant", "t-3")])).await.overall_code,
        OVER
    );
}

#[tokio::test]
async fn wildcard_without_share_threshold_counts_each_value() {
    let s = TestServer::start(EDGE).await;
    for v in [
        "/api/a/users/1",
        "/api/a/users/1",
        "/api/b/users/1",
        "/api/b/users/1",
    ] {
        assert_eq!(
            s.call(one("edge", &[("path", v)])).await.overall_code,
            OK,
            "{v}"
        );
    }
    assert_eq!(
        s.call(one("edge", &[("path", "/api/a/users/1")]))
            .await
            .overall_code,
        OVER
    );
}

#[tokio::test]
async fn shadow_mode_reports_ok_and_global_shadow_keeps_statuses() {
    let s = TestServer::start(EDGE).await;
    s.call(one("edge", &[("shadow", "x")])).await;
    let r = s.call(one("edge", &[("shadow", "x")])).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    let metrics = reqwest::get(format!("{}/metrics", s.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",descriptor=\"shadow\"} 1"
        ),
        "{metrics}"
    );

    let g = TestServer::start_with(EDGE, &[("SHADOW_MODE", "true")]).await;
    g.call(one("edge", &[("general", "x")])).await;
    let r = g.call(one("edge", &[("general", "x")])).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0)]));
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let s = TestServer::start(EDGE).await;
    let both = || {
        req(
            "edge",
            vec![desc(&[("quota_a", "x")]), desc(&[("quota_b", "x")])],
        )
    };
    assert_eq!(s.call(both()).await.overall_code, OK);
    // Use up quota_a alone; with quota_b still free the request passes.
    let r = s
        .call(req(
            "edge",
            vec![desc(&[("quota_a", "x")]), desc(&[("quota_b", "y")])],
        ))
        .await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OK, OVER));
    let r = s.call(both()).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OVER, 0), (OVER, 0)])
    );
}

/// A quota descriptor is over when any of its limits is; a request it refuses consumes nothing,
/// not on the descriptor's other limits either.
#[tokio::test]
async fn a_quota_descriptor_over_on_one_of_its_limits_refuses_and_consumes_nothing() {
    const QUOTA_PAIR: &str = r#"
domain: quota_pair
descriptors:
  - key: plan
    quota_mode: true
    rate_limits:
      - {unit: second, requests_per_unit: 1, name: tight}
      - {unit: hour, requests_per_unit: 3, name: loose}
"#;
    let s = TestServer::start(QUOTA_PAIR).await;
    let call = || s.call(one("quota_pair", &[("plan", "x")]));
    // loose: 3 -> 2.
    assert_eq!(call().await.overall_code, OK);
    // tight is over, so the only quota descriptor is over: refused, and loose stays at 2.
    let r = call().await;
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![(OVER, 0)]));
    for second in 1..=2 {
        s.advance(Duration::from_secs(1));
        let r = call().await;
        assert_eq!(r.overall_code, OK, "second {second}: loose had room left");
    }
    s.advance(Duration::from_secs(1));
    let r = call().await;
    assert_eq!(
        r.overall_code, OVER,
        "loose used up by the three admitted requests"
    );
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let s = TestServer::start(EDGE).await;
    for _ in 0..3 {
        let r = s
            .call(req(
                "edge",
                vec![desc(&[("general", "g")]), desc(&[("special", "s")])],
            ))
            .await;
        assert_eq!(r.overall_code, OK);
        assert!(
            r.statuses[0].current_limit.is_none(),
            "replaced: no current_limit"
        );
        assert_eq!(
            r.statuses[1].current_limit.as_ref().unwrap().name,
            "special"
        );
    }
    // The replaced counter was never touched: alone, `general` still has its one request.
    assert_eq!(
        s.call(one("edge", &[("general", "g")])).await.overall_code,
        OK
    );
    assert_eq!(
        s.call(one("edge", &[("general", "g")])).await.overall_code,
        OVER
    );
}

#[tokio::test]
async fn envoy_limit_override_applies_without_shadow_mode() {
    let s = TestServer::start(EDGE).await;
    let mut d = desc(&[("shadow", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR
    });
    let r = s.call(req("edge", vec![d.clone()])).await;
    let l = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((r.overall_code, l.requests_per_unit, l.unit), (OK, 1, 3));
    // Over, and not rewritten to OK although the config node is in shadow mode.
    assert_eq!(
        s.call(req("edge", vec![d.clone()])).await.overall_code,
        OVER
    );
    // Unknown domain: the override is ignored, as in the reference.
    assert_eq!(
        s.call(req("other", vec![d])).await.statuses[0].current_limit,
        None
    );
}

#[tokio::test]
async fn ratelimit_headers_with_default_and_custom_names() {
    let s = TestServer::start_with(EDGE, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    // Two descriptors: the one with least remaining is reported.
    let r = s
        .call(req(
            "edge",
            vec![desc(&[("api_key", "vip")]), desc(&[("api_key", "hdr")])],
        ))
        .await;
    assert_eq!(header(&r, "RateLimit-Limit"), Some("3"));
    assert_eq!(header(&r, "RateLimit-Remaining"), Some("2"));
    assert_eq!(header(&r, "RateLimit-Reset"), Some("40"));

    let c = TestServer::start_with(
        EDGE,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "X-Lim"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
        ],
    )
    .await;
    let r = c.call(one("edge", &[("blocked", "b")])).await;
    assert_eq!(
        (
            header(&r, "X-Lim"),
            header(&r, "X-Left"),
            header(&r, "X-Reset")
        ),
        (Some("0"), Some("0"), Some("40"))
    );
    // Off by default.
    let d = TestServer::start(EDGE).await;
    assert!(d
        .call(one("edge", &[("api_key", "a")]))
        .await
        .response_headers_to_add
        .is_empty());
}

/// envoyproxy/ratelimit returns dynamic metadata only with `RESPONSE_DYNAMIC_METADATA=true`:
/// the request (domain, descriptors as `key=value` entries) and, under `metadata`, the
/// `metadata` of the descriptors that passed (`src/service/ratelimit.go`, `ratelimitToMetadata`).
#[tokio::test]
async fn metadata_is_returned_as_dynamic_metadata() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let s = TestServer::start_with(EDGE, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
    let r = s.call(one("edge", &[("meta", "m")])).await;
    let md = r.dynamic_metadata.expect("dynamic metadata");
    let field = |name: &str| md.fields.get(name).and_then(|v| v.kind.clone());
    assert_eq!(field("domain"), Some(Kind::StringValue("edge".into())));
    let Some(Kind::StructValue(passed)) = field("metadata") else {
        panic!("no metadata in {md:?}");
    };
    assert!(passed.fields.contains_key("team"), "{passed:?}");
    let Some(Kind::ListValue(descriptors)) = field("descriptors") else {
        panic!("no descriptors in {md:?}");
    };
    assert_eq!(descriptors.values.len(), 1);
    // A domain with no config: the request's metadata all the same, as the reference builds it
    // for any domain, and no `metadata` (no limit passed).
    let r = s.call(one("unconfigured", &[("meta", "m")])).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    let md = r
        .dynamic_metadata
        .expect("dynamic metadata for an unknown domain");
    let field = |name: &str| md.fields.get(name).and_then(|v| v.kind.clone());
    assert_eq!(
        field("domain"),
        Some(Kind::StringValue("unconfigured".into()))
    );
    let Some(Kind::ListValue(descriptors)) = field("descriptors") else {
        panic!("no descriptors in {md:?}");
    };
    let Some(Kind::StructValue(d0)) = descriptors.values[0].kind.clone() else {
        panic!("{descriptors:?}");
    };
    assert_eq!(
        d0.fields["entries"].kind,
        Some(Kind::ListValue(
            envoy_types::pb::google::protobuf::ListValue {
                values: vec![envoy_types::pb::google::protobuf::Value {
                    kind: Some(Kind::StringValue("meta=m".into()))
                }]
            }
        ))
    );
    assert!(field("metadata").is_none(), "{md:?}");
    // Off by default, as in the reference.
    let d = TestServer::start(EDGE).await;
    let r = d.call(one("edge", &[("meta", "m")])).await;
    assert!(r.dynamic_metadata.is_none(), "{:?}", r.dynamic_metadata);
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_naming_the_problem() {
    let s = TestServer::start(EDGE).await;
    let cases = vec![
        (one("", &[("k", "v")]), "domain"),
        (req("edge", vec![]), "descriptors"),
        (
            req("edge", vec![desc(&[])]),
            "descriptors[0] has no entries",
        ),
        (one("edge", &[("", "v")]), "entries[0].key"),
        (
            one("edge", &[("k", &"v".repeat(5000))]),
            "value is 5000 bytes",
        ),
        (
            req("edge", (0..100).map(|_| desc(&[("k", "v")])).collect()),
            "too many descriptors",
        ),
    ];
    for (r, needle) in cases {
        let e = s.try_call(r).await.expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{needle}");
        assert!(
            e.message().contains(needle),
            "{} should mention {needle}",
            e.message()
        );
    }
    // An oversized message is refused by the transport, not decided.
    let huge = req("edge", vec![desc(&[("k", &"v".repeat(2 << 20))])]);
    let refused = s.try_call(huge).await.expect_err("refused");
    // The decoder's limit (1 MiB): INVALID_ARGUMENT, naming the size.
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("too large"), "{refused:?}");
    // The service is still up.
    assert_eq!(
        s.call(one("edge", &[("api_key", "z")])).await.overall_code,
        OK
    );
}

#[tokio::test]
async fn health_service_answers_for_both_names_and_goes_not_serving_on_shutdown() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let mut s = TestServer::start(EDGE).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", s.running().grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(ch);
    for name in ["", "ratelimit"] {
        let st = h
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(st, 1, "SERVING for {name:?}");
    }
    let mut watch = h
        .watch(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, 1);
    let http = s.http.clone();
    assert_eq!(
        reqwest::get(format!("{http}/healthcheck"))
            .await
            .unwrap()
            .status(),
        200
    );
    let addr = s.running().grpc_addr;
    let running = s.running.take().unwrap();
    let stopping = tokio::spawn(running.shutdown());
    // NOT_SERVING (2) is announced before the listeners close.
    let next = watch.message().await.unwrap().unwrap();
    assert_eq!(next.status, 2);
    drop(watch);
    drop(h);
    stopping.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
    assert!(
        reqwest::get(format!("{http}/healthcheck")).await.is_err(),
        "HTTP closed too"
    );
}

#[tokio::test]
async fn json_endpoint_answers_200_429_and_400() {
    let s = TestServer::start(EDGE).await;
    let http = reqwest::Client::new();
    let post = |body: String| http.post(format!("{}/json", s.http)).body(body).send();
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"general","value":"j"}]}]}"#;
    let r = post(body.into()).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(v["statuses"][0]["durationUntilReset"], "40s");
    let r = post(body.into()).await.unwrap();
    assert_eq!(r.status(), 429);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    // camelCase and snake_case both accepted, hits_addend honoured.
    let r = post(r#"{"domain":"edge","hitsAddend":3,"descriptors":[{"entries":[{"key":"api_key","value":"j"}]}]}"#.into()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["statuses"][0].get("limitRemaining"),
        None
    );
    for bad in [
        "not json",
        r#"{"domain":""}"#,
        r#"{"domain":"edge","descriptors":[{"entries":[]}]}"#,
        r#"{"domain":"edge","bogus":1}"#,
    ] {
        let r = post(bad.into()).await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
}
