//! Client values on the ports, through the real binary run as Istio's sample runs it (every
//! port on 0.0.0.0, settings from the environment, the config a mounted ConfigMap): no
//! descriptor value or direct API key a client sent appears in any answer of the HTTP, debug
//! or metrics ports, except the series of a `detailed_metric` limit, which the config opted
//! into; the heavy hitters name the limited client by its keyed digest, which `turnstile
//! digest` and the admin listener compute; the admin listener, with its token, shows clear
//! values; `TURNSTILE_SHOW_CLIENT_VALUES=true` shows them on the open ports; the status page,
//! rendered by headless Chromium, names the limited client by its digest.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use ring::hmac;
use serde_json::{json, Value};

use crate::common::binary::{block_on, call, configmap, http_get, request, Server, BIN};
use crate::common::tempdir::TempDir;
use crate::hitters::status_page::chromium;

const CONFIG: &str = "domain: web
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: user
    detailed_metric: true
    rate_limit:
      unit: hour
      requests_per_unit: 1000
";

const LIMITED: &str = "203.0.113.9";
const API_KEY: &str = "sk_live_7Hq2mZpR4xW9";
/// Sent over `/json` on the HTTP port.
const JSON_CLIENT: &str = "198.51.100.77";
/// A GoCC `/rate` key.
const RATE_KEY: &str = "tenant-4711-export";
/// Under `detailed_metric`: its series name it, as the reference's do.
const DETAILED_USER: &str = "user-detailed-0042";
const DIGEST_KEY: &str = "test-digest-key-0123456789abcdef";
const ADMIN_TOKEN: &str = "an-admin-token-0123456789";

/// The documented digest: HMAC-SHA256 under the key, 8 bytes in hex after `#`.
fn expected_digest(value: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, DIGEST_KEY.as_bytes());
    let tag = hmac::sign(&key, value.as_bytes());
    let hex: String = tag.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("#{hex}")
}

/// The binary as Istio's sample runs it, every port on 0.0.0.0, with `extra` settings.
fn istio_on_open_ports(t: &TempDir, extra: &[(&str, &str)]) -> Server {
    let config_dir = t.path().join("data/ratelimit/config");
    configmap(&config_dir, CONFIG);
    let exe = t.path().join("bin/ratelimit");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(BIN, &exe).unwrap();
    let root = t.path().join("data").display().to_string();
    let mut env = vec![
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("HOST", "0.0.0.0"),
        ("GRPC_HOST", "0.0.0.0"),
        ("DEBUG_HOST", "0.0.0.0"),
        ("PROMETHEUS_ADDR", "0.0.0.0:0"),
        ("TURNSTILE_TOP_SAMPLE", "1"),
    ];
    env.extend_from_slice(extra);
    Server::start(&exe, &[], &env)
}

/// A port bound to 0.0.0.0, reached over loopback.
fn local(a: SocketAddr) -> SocketAddr {
    assert!(a.ip().is_unspecified(), "bound beyond loopback: {a}");
    SocketAddr::from(([127, 0, 0, 1], a.port()))
}

/// The admin listener's address, from the ready line.
fn admin_addr(ready: &str) -> SocketAddr {
    (ready.split_whitespace())
        .find_map(|p| p.strip_prefix("admin="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in {ready:?}"))
}

/// The limited client refused, the others counted, over gRPC, `/json` and `/rate`.
fn traffic(grpc: SocketAddr, http: SocketAddr) {
    block_on(async {
        let mut over = 0;
        for _ in 0..12 {
            let r = call(grpc, request("web", "remote_address", LIMITED), &[]).await;
            over += usize::from(r.overall_code == 2);
        }
        assert_eq!(over, 7);
        for _ in 0..3 {
            call(grpc, request("web", "api_key", API_KEY), &[]).await;
            call(grpc, request("web", "user", DETAILED_USER), &[]).await;
        }
        let c = reqwest::Client::new();
        let body = json!({"domain": "web", "descriptors": [
            {"entries": [{"key": "remote_address", "value": JSON_CLIENT}]}]});
        let r = c.post(format!("http://{http}/json")).json(&body).send();
        assert_eq!(r.await.unwrap().status(), 200);
        let r = c.post(format!("http://{http}/rate/{RATE_KEY}")).send();
        assert_eq!(r.await.unwrap().status(), 200);
    });
}

/// Every answer of the HTTP, debug and metrics ports, by where it came from.
fn every_answer(http: SocketAddr, debug: SocketAddr, metrics: SocketAddr) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let gets = [
        (http, "/healthcheck"),
        (http, "/healthz"),
        (http, "/rlconfig"),
        (http, "/metrics"),
        (http, "/debug"),
        (http, "/debug/tenant-4711-export"),
        (debug, "/"),
        (debug, "/rlconfig"),
        (debug, "/metrics"),
        (debug, "/debug/top"),
        (debug, "/debug/status"),
        (metrics, "/metrics"),
    ];
    for (addr, path) in gets {
        out.push((format!("{addr}{path}"), http_get(addr, path)));
    }
    let page = block_on(async {
        let c = reqwest::Client::new();
        let r = c
            .get(format!("http://{debug}/"))
            .header("accept", "text/html");
        r.send().await.unwrap().text().await.unwrap()
    });
    out.push((format!("{debug}/ (text/html)"), page));
    out
}

/// Admin listener calls with the token.
fn admin(
    addr: SocketAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    block_on(async {
        let c = reqwest::Client::new();
        let mut r = c
            .request(method, format!("http://{addr}{path}"))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

/// The first value of `limit`'s over-limit list in a `/debug/top` answer.
fn top_limited(top: &Value, limit: &str) -> String {
    let limits = top["limits"].as_array().expect("limits");
    let l = limits
        .iter()
        .find(|l| l["limit"] == limit)
        .unwrap_or_else(|| panic!("no {limit} in {top}"));
    l["by_refused"][0]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("nobody limited on {limit}: {top}"))
        .to_owned()
}

/// No client value in any answer of the open ports, but `detailed_metric`'s series on metrics.
fn no_client_value_in_any_answer(http: SocketAddr, debug: SocketAddr, metrics: SocketAddr) {
    let answers = every_answer(http, debug, metrics);
    for (from, body) in &answers {
        for value in [LIMITED, API_KEY, JSON_CLIENT, RATE_KEY] {
            assert!(!body.contains(value), "{from} shows {value:?}:\n{body}");
        }
        if !from.ends_with("/metrics") {
            assert!(
                !body.contains(DETAILED_USER),
                "{from} shows {DETAILED_USER:?}:\n{body}"
            );
        }
    }
    // `detailed_metric` opted the config into per-value series, as the reference names them.
    let m = http_get(metrics, "/metrics");
    assert!(
        m.contains(DETAILED_USER),
        "the detailed_metric series:\n{m}"
    );
}

/// The admin listener, with its token, shows clear values beside their digests.
fn admin_listener_shows_clear_values(a: SocketAddr, digest: &str) {
    // The admin listener, with its token, shows clear values beside their digests.
    let (status, top) = admin(
        a,
        reqwest::Method::GET,
        "/admin/top?limit=web.remote_address",
        None,
    );
    assert_eq!(status, 200, "{top}");
    let first = &top["limits"][0]["by_refused"][0];
    assert_eq!(first["value"], format!("remote_address={LIMITED}"), "{top}");
    assert_eq!(first["digest"], format!("remote_address={digest}"), "{top}");
    let body = json!({"values": [API_KEY]});
    let (status, d) = admin(a, reqwest::Method::POST, "/admin/digest", Some(body));
    assert_eq!(
        (status, &d["digests"][API_KEY]),
        (200, &json!(expected_digest(API_KEY)))
    );
    let unauthorized = block_on(async {
        let r = reqwest::get(format!("http://{a}/admin/top")).await.unwrap();
        r.status().as_u16()
    });
    assert_eq!(unauthorized, 401);
    // A reset is logged at info: with the value's digest, not the value.
    let reset = json!({"domain": "web", "descriptors": [
        {"entries": [{"key": "api_key", "value": API_KEY}]}]});
    let (status, v) = admin(a, reqwest::Method::POST, "/admin/reset", Some(reset));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn istio_sample_on_open_ports_shows_no_client_value_and_the_admin_listener_does() {
    let t = TempDir::new("client-values");
    let token = t.write("admin.token", &format!("{ADMIN_TOKEN}\n"));
    let token = token.to_str().unwrap();
    let server = istio_on_open_ports(
        &t,
        &[
            ("TURNSTILE_CLIENT_DIGEST_KEY", DIGEST_KEY),
            ("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0"),
            ("TURNSTILE_ADMIN_TOKEN_FILE", token),
        ],
    );
    let p = &server.ports;
    let (grpc, http, debug, metrics) = (
        local(p.grpc_addr()),
        local(p.http),
        local(p.debug.unwrap()),
        local(p.metrics.unwrap()),
    );
    traffic(grpc, http);

    no_client_value_in_any_answer(http, debug, metrics);

    // Who is limited, by the digest an operator computes from their own logs.
    let top: Value = serde_json::from_str(&http_get(debug, "/debug/top")).unwrap();
    assert_eq!(top["values"], "digest", "{top}");
    let digest = expected_digest(LIMITED);
    assert_eq!(
        top_limited(&top, "web.remote_address"),
        format!("remote_address={digest}")
    );
    let cli = Command::new(BIN)
        .args(["digest", LIMITED])
        .env_clear()
        .env("TURNSTILE_CLIENT_DIGEST_KEY", DIGEST_KEY)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&cli.stdout);
    assert_eq!(printed.trim(), format!("{LIMITED}\t{digest}"), "{cli:?}");
    let debug_all: Value = serde_json::from_str(&http_get(http, "/debug")).unwrap();
    let rate_digest = expected_digest(RATE_KEY);
    assert_eq!(
        debug_all["Instances"][&rate_digest]["Key"],
        json!(rate_digest),
        "{debug_all}"
    );
    // GoCC's `/debug/{key}` finds the key by its digest too (`#` as `%23`).
    let path = format!("/debug/%23{}", &rate_digest[1..]);
    let one: Value = serde_json::from_str(&http_get(http, &path)).unwrap();
    assert_eq!(one["Key"], json!(rate_digest), "{one}");

    admin_listener_shows_clear_values(admin_addr(&server.ready), &digest);

    let logs = server.stop();
    assert!(logs.contains("limit reset"), "{logs}");
    for value in [LIMITED, API_KEY, JSON_CLIENT, RATE_KEY, DETAILED_USER] {
        assert!(
            !logs.contains(value),
            "the info log shows {value:?}:\n{logs}"
        );
    }
    assert!(logs.contains(&expected_digest(API_KEY)), "{logs}");
}

#[test]
fn show_client_values_true_shows_them_on_open_ports_and_says_so() {
    let t = TempDir::new("client-values-shown");
    let server = istio_on_open_ports(&t, &[("TURNSTILE_SHOW_CLIENT_VALUES", "true")]);
    let p = &server.ports;
    let (grpc, http, debug) = (local(p.grpc_addr()), local(p.http), local(p.debug.unwrap()));
    traffic(grpc, http);
    let top: Value = serde_json::from_str(&http_get(debug, "/debug/top")).unwrap();
    assert_eq!(top["values"], "clear", "{top}");
    assert_eq!(
        top_limited(&top, "web.remote_address"),
        format!("remote_address={LIMITED}")
    );
    let debug_all: Value = serde_json::from_str(&http_get(http, "/debug")).unwrap();
    assert_eq!(
        debug_all["Instances"][RATE_KEY]["Key"], RATE_KEY,
        "{debug_all}"
    );
    server.stop();
}

/// The status page on the open debug port, in headless Chromium: the limited client is named
/// by its digest, and its value is nowhere in the rendered page.
#[test]
fn chromium_names_the_limited_client_by_its_digest_on_an_open_debug_port() {
    let t = TempDir::new("client-values-page");
    let server = istio_on_open_ports(&t, &[("TURNSTILE_CLIENT_DIGEST_KEY", DIGEST_KEY)]);
    let p = &server.ports;
    let (grpc, http, debug) = (local(p.grpc_addr()), local(p.http), local(p.debug.unwrap()));
    traffic(grpc, http);
    let profile: PathBuf = t.path().join("profile");
    let url = format!("http://{debug}/");
    let dom = chromium(
        &profile,
        &["--virtual-time-budget=5000", "--dump-dom", &url],
    );
    let table = dom
        .split_once("id=\"over-web.remote_address\"")
        .map(|(_, rest)| rest.split_once("</table>").map_or(rest, |(t, _)| t))
        .unwrap_or_else(|| panic!("no over-limit table for web.remote_address in:\n{dom}"));
    let first_row = table.split("<tr>").nth(2).expect("a first row");
    let digest = expected_digest(LIMITED);
    assert!(
        first_row.contains(&format!("remote_address={digest}")),
        "{table}"
    );
    assert!(!dom.contains(LIMITED) && !dom.contains(API_KEY), "{dom}");
    assert!(
        dom.contains("keyed digests"),
        "the page says how values are shown:\n{dom}"
    );
    server.stop();
}
