//! The operator's view on the debug port, against the real server under traffic with a real
//! HTTP client: `/debug/top` lists who is limited, its filters, `/debug/status`, and `/`
//! answering a browser with the status page and other clients with the endpoint list.

use crate::common::{one, TestServer, OVER};
use serde_json::Value;

const WEB: &str = "
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
";

const API: &str = "
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

const LIMITED: &str = "203.0.113.9";

/// Every admitted hit counted (`TURNSTILE_TOP_SAMPLE=1`), so the counts below are exact.
async fn server() -> TestServer {
    let env = [
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("TURNSTILE_TOP_SAMPLE", "1"),
    ];
    TestServer::start_files(&[("web.yaml", WEB), ("api.yaml", API)], &env).await
}

fn debug(s: &TestServer, path: &str) -> String {
    format!("http://{}{path}", s.running().debug_addr.unwrap())
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().await.expect("a JSON body"))
}

/// One client well over its limit, a crowd of others within theirs, and traffic on the other
/// domain, some of it sent while the lists are read.
async fn traffic(s: &TestServer) {
    let mut over = 0;
    for _ in 0..30 {
        let r = s.call(one("web", &[("remote_address", LIMITED)])).await;
        over += usize::from(r.overall_code == OVER);
    }
    assert_eq!(over, 25);
    for i in 0..40 {
        let ip = format!("10.0.0.{i}");
        for _ in 0..3 {
            s.call(one("web", &[("remote_address", &ip)])).await;
        }
    }
    for _ in 0..4 {
        s.call(one("api", &[("api_key", "k1")])).await;
    }
}

fn limit<'a>(body: &'a Value, stat_key: &str) -> &'a Value {
    body["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == stat_key)
        .unwrap_or_else(|| panic!("no {stat_key} in {body}"))
}

#[tokio::test]
async fn the_client_over_its_limit_is_first_in_refused_order() {
    let s = server().await;
    traffic(&s).await;
    let background = {
        let client = s.client.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                let r = one(
                    "web",
                    &[("remote_address", &format!("198.51.100.{}", i % 50))],
                );
                let _ = client.clone().should_rate_limit(r).await;
            }
        })
    };
    let (status, body) = get_json(&debug(&s, "/debug/top")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["top_n"], 20);
    assert_eq!(body["window_seconds"], 60);
    let web = limit(&body, "web.remote_address");
    assert_eq!(web["domain"], "web");
    let first = &web["by_refused"][0];
    assert_eq!(first["value"], format!("remote_address={LIMITED}"), "{web}");
    assert_eq!(
        (first["hits"].as_u64(), first["refused"].as_u64()),
        (Some(30), Some(25))
    );
    assert_eq!(
        web["by_refused"].as_array().unwrap().len(),
        1,
        "only one client was refused"
    );
    assert_eq!(
        web["by_hits"][0]["value"],
        format!("remote_address={LIMITED}")
    );
    let seen = crate::common::T0 / 1_000_000_000;
    assert_eq!(
        (first["first_seen"].as_u64(), first["last_seen"].as_u64()),
        (Some(seen), Some(seen))
    );
    assert_eq!(
        web["by_hits"].as_array().unwrap().len(),
        20,
        "the top 20 of 41+ values"
    );
    let api = limit(&body, "api.api_key");
    assert_eq!(api["by_hits"][0]["value"], "api_key=k1");
    assert_eq!(api["by_hits"][0]["hits"], 4);
    background.await.unwrap();
}

#[tokio::test]
async fn filters_pick_a_domain_or_a_limit_and_a_bad_one_is_a_clear_400() {
    let s = server().await;
    traffic(&s).await;
    let keys = |b: &Value| -> Vec<String> {
        b["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["limit"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, all) = get_json(&debug(&s, "/debug/top")).await;
    assert_eq!(keys(&all), ["api.api_key", "web.remote_address"]);
    let (status, body) = get_json(&debug(&s, "/debug/top?domain=api")).await;
    assert_eq!((status, keys(&body)), (200, vec!["api.api_key".to_owned()]));
    let (status, body) = get_json(&debug(&s, "/debug/top?limit=web.remote_address")).await;
    assert_eq!(
        (status, keys(&body)),
        (200, vec!["web.remote_address".to_owned()])
    );
    let both = "/debug/top?domain=web&limit=web.remote_address";
    assert_eq!(
        keys(&get_json(&debug(&s, both)).await.1),
        ["web.remote_address"]
    );
    for (query, says) in [
        (
            "domain=nope",
            "no domain \"nope\" in the loaded config (domains: api, web)",
        ),
        ("limit=web.nope", "no limit with stat key \"web.nope\""),
        (
            "domain=api&limit=web.remote_address",
            "not in domain \"api\"",
        ),
        (
            "top=5",
            "unknown query parameter \"top\" (known: domain, limit)",
        ),
        ("domain=", "domain= needs a value"),
        ("domain=web&domain=api", "domain= is given twice"),
    ] {
        let (status, body) = get_json(&debug(&s, &format!("/debug/top?{query}"))).await;
        assert_eq!(status, 400, "{query}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{query}: {error}");
    }
}

#[tokio::test]
async fn status_has_the_limits_their_counters_the_shards_and_the_config() {
    let s = server().await;
    traffic(&s).await;
    let (status, body) = get_json(&debug(&s, "/debug/status")).await;
    assert_eq!(status, 200, "{body}");
    let web = limit(&body, "web.remote_address");
    assert_eq!(web["over_limit"], 25);
    assert_eq!(web["total_hits"], 30 + 40 * 3);
    assert_eq!(
        web["rules"][0],
        "unit=MINUTE requests_per_unit=5 algorithm=fixed_window"
    );
    assert_eq!(body["backend"], "memory");
    let shards = body["shards"].as_array().unwrap();
    assert_eq!(shards.len(), crate::common::layout().1);
    assert!(shards
        .iter()
        .all(|s| s["breaker"] == "closed" && s["waiting"] == 0));
    assert_eq!(body["config"]["loads"], 1);
    assert_eq!(body["config"]["load_errors"], 0);
    assert_eq!(body["config"]["live"]["error"], Value::Null);
    assert_eq!(body["config"]["version"].as_str().unwrap().len(), 16);
    assert_eq!(body["requests"]["over_limit"], 25);
}

#[tokio::test]
async fn root_is_the_page_for_browsers_and_the_endpoint_list_for_others() {
    let s = server().await;
    let http = reqwest::Client::new();
    let text = http.get(debug(&s, "/")).send().await.unwrap();
    assert!(text.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = text.text().await.unwrap();
    assert!(text.starts_with("/rlconfig: print out the currently loaded configuration"));
    assert!(text.contains("/debug/top: "), "{text}");
    let page = http
        .get(debug(&s, "/"))
        .header("accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8")
        .send()
        .await
        .unwrap();
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = page.text().await.unwrap();
    assert!(page.contains("/debug/top") && page.contains("/debug/status"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no external assets"
    );
}

/// By default admitted hits are sampled (one call in 8, weighing 8): a client sending most of
/// the traffic is still first by hits with an estimate close to its count, and refusals are
/// counted exactly.
#[tokio::test]
async fn sampled_admitted_hits_still_find_the_heavy_client_and_refusals_stay_exact() {
    let env = [("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")];
    let s = TestServer::start_files(&[("web.yaml", WEB), ("api.yaml", API)], &env).await;
    for _ in 0..2000 {
        s.call(one("api", &[("api_key", "heavy")])).await;
    }
    for i in 0..200 {
        s.call(one("api", &[("api_key", &format!("light{}", i % 20))]))
            .await;
    }
    let mut over = 0;
    for _ in 0..30 {
        let r = s.call(one("web", &[("remote_address", LIMITED)])).await;
        over += usize::from(r.overall_code == OVER);
    }
    let (_, body) = get_json(&debug(&s, "/debug/top")).await;
    assert_eq!(body["sample"], 8);
    let api = limit(&body, "api.api_key");
    assert_eq!(api["by_hits"][0]["value"], "api_key=heavy", "{api}");
    let estimate = api["by_hits"][0]["hits"].as_u64().unwrap();
    // 250 samples expected of 2000 calls: the estimate is within ±30 % with overwhelming odds.
    assert!(
        (1400..=2600).contains(&estimate),
        "estimated {estimate} of 2000"
    );
    let web = limit(&body, "web.remote_address");
    assert_eq!(web["by_refused"][0]["refused"], over as u64, "{web}");
}

/// On a debug port bound beyond loopback client values are digests; a value the config fixes
/// (`tokens: input`, written in the config, not sent by a client) is not a client value and
/// shows as written, beside the client's value as a digest.
#[tokio::test]
async fn values_the_config_fixes_show_clear_beside_client_digests() {
    let config = "
domain: ai
descriptors:
  - key: tokens
    value: input
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: model
    value: gpt-*
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let env = [
        ("DEBUG_HOST", "0.0.0.0"),
        ("DEBUG_PORT", "0"),
        ("TURNSTILE_TOP_SAMPLE", "1"),
        (
            "TURNSTILE_CLIENT_DIGEST_KEY",
            "test-digest-key-0123456789abcdef",
        ),
    ];
    let s = TestServer::start_with(config, &env).await;
    for _ in 0..3 {
        s.call(one("ai", &[("tokens", "input"), ("user", "alice")]))
            .await;
        s.call(one("ai", &[("model", "gpt-4")])).await;
    }
    let port = s.running().debug_addr.unwrap().port();
    let (status, body) = get_json(&format!("http://127.0.0.1:{port}/debug/top")).await;
    assert_eq!(
        (status, &body["values"]),
        (200, &Value::from("digest")),
        "{body}"
    );
    let first = |stat_key: &str| limit(&body, stat_key)["by_refused"][0]["value"].clone();
    let user = first("ai.tokens_input.user");
    let user = user.as_str().unwrap();
    assert!(user.starts_with("tokens=input, user=#"), "{body}");
    assert!(!user.contains("alice"), "{body}");
    // A wildcard takes the client's value: a client value, so a digest.
    let model = first("ai.model_gpt-*");
    assert!(model.as_str().unwrap().starts_with("model=#"), "{body}");
}
