//! Client values on the ports, through the real binary run as Istio's sample runs it (every
//! port on 0.0.0.0, settings from the environment, the config a mounted ConfigMap): no
//! descriptor value, direct API key or RLQS bucket value a client sent appears in any answer of
//! the HTTP, debug or metrics ports, nor in any label of any series of any of them, except the
//! series of a `detailed_metric` limit, which the config opted into. Every family those ports
//! declare must have a series after the traffic, so a new family is walked too; the heavy hitters name the limited client by its keyed digest, which `turnstile
//! digest` and the admin listener compute; the admin listener, with its token, shows clear
//! values; `TURNSTILE_SHOW_CLIENT_VALUES=true` shows them on the open ports; the status page,
//! rendered by headless Chromium, names the limited client by its digest.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

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
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 20
  # Its parameters' families (burst, queue) have series too, so the walk covers them.
  - key: session
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 20
      queue: {max_waiting: 2, max_wait: 100ms}
";

const LIMITED: &str = "203.0.113.9";
const API_KEY: &str = "sk_live_7Hq2mZpR4xW9";
/// Sent over `/json` on the HTTP port.
const JSON_CLIENT: &str = "198.51.100.77";
/// A GoCC `/rate` key.
const RATE_KEY: &str = "tenant-4711-export";
/// Under `detailed_metric`: its series name it, as the reference's do.
const DETAILED_USER: &str = "user-detailed-0042";
/// An RLQS bucket's value, as an Envoy reports `{tenant: ...}`.
const RLQS_TENANT: &str = "alicesecret42";
/// A `POST /throttle` key.
const THROTTLE_KEY: &str = "throttle-key-7781";
/// Every value a client sent that no open port may show.
const CLIENT_VALUES: [&str; 6] = [
    LIMITED,
    API_KEY,
    JSON_CLIENT,
    RATE_KEY,
    RLQS_TENANT,
    THROTTLE_KEY,
];
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
        let body =
            json!({"key": THROTTLE_KEY, "max_burst": 3, "count_per_period": 10, "period": 60});
        let r = c.post(format!("http://{http}/throttle")).json(&body).send();
        assert_eq!(r.await.unwrap().status(), 200);
    });
}

/// An Envoy's RLQS stream, open until dropped: it reported the bucket `{tenant: RLQS_TENANT}`
/// and was assigned a share, so the quota hub's series show the limit the bucket shares.
struct RlqsStream {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RlqsStream {
    fn open(grpc: SocketAddr) -> RlqsStream {
        let (stop, stopped) = mpsc::channel::<()>();
        let (assigned, got) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            block_on(async move {
                let url = format!("http://{grpc}");
                let mut client = RateLimitQuotaServiceClient::connect(url).await.unwrap();
                let (reports, rx) = tokio::sync::mpsc::channel(4);
                let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
                let mut actions = (client.stream_rate_limit_quotas(stream).await)
                    .expect("the RLQS stream opens")
                    .into_inner();
                let usage = BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: [("tenant".to_owned(), RLQS_TENANT.to_owned())].into(),
                    }),
                    time_elapsed: Some(PbDuration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    num_requests_allowed: 5,
                    num_requests_denied: 0,
                };
                let report = RateLimitQuotaUsageReports {
                    domain: "web".into(),
                    bucket_quota_usages: vec![usage],
                };
                reports.send(report).await.unwrap();
                let first = actions.message().await;
                assigned.send(format!("{first:?}")).unwrap();
                // Open until the test is done with it (a closed stream's buckets go).
                tokio::task::spawn_blocking(move || stopped.recv())
                    .await
                    .ok();
                drop(reports);
            });
        });
        let first = (got.recv_timeout(Duration::from_secs(30)))
            .expect("an answer to the RLQS report within 30 s");
        assert!(first.contains("QuotaAssignmentAction"), "{first}");
        RlqsStream {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for RlqsStream {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until `metrics`'s `/metrics` has a series of `family` (the quota hub's view is
/// renewed after the report, not with it).
fn wait_for_series(addr: SocketAddr, family: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = http_get(addr, "/metrics");
        if series_of(&text).iter().any(|s| s.name == family) {
            return;
        }
        assert!(Instant::now() < deadline, "no {family} series:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One series of a scrape: its name and its labels, values unescaped.
#[derive(Debug)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

/// Every series of a Prometheus text exposition.
fn series_of(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..end].to_owned();
        let mut labels = Vec::new();
        if line[end..].starts_with('{') {
            let mut rest = &line[end + 1..];
            while let Some((key, after)) = rest.split_once("=\"") {
                let mut value = String::new();
                let mut chars = after.char_indices();
                let mut close = after.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '"' => {
                            close = i;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                labels.push((key.trim_start_matches(',').to_owned(), value));
                rest = &after[close + 1..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
        out.push(Series { name, labels });
    }
    out
}

/// The families a scrape declares (`# TYPE`), with their kinds.
fn families_of(text: &str) -> Vec<(String, String)> {
    (text.lines())
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, k)| (n.to_owned(), k.to_owned()))
        .collect()
}

/// Whether `series` belongs to `family` of `kind` (a histogram's or a summary's parts too).
fn of_family(series: &str, family: &str, kind: &str) -> bool {
    series == family
        || (matches!(kind, "histogram" | "summary")
            && ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| series.strip_prefix(family) == Some(s)))
}

/// Every series of every port that serves series: no label value holds a client value, but
/// `detailed_metric`'s, and every family declared has a series, so none went unwalked.
fn no_client_value_in_any_series(ports: &[(&str, SocketAddr, &str)]) {
    let mut empty = BTreeSet::new();
    for (port, addr, path) in ports {
        let text = http_get(*addr, path);
        let series = series_of(&text);
        for (family, kind) in families_of(&text) {
            if !series.iter().any(|s| of_family(&s.name, &family, &kind)) {
                empty.insert(format!("{port}: {family}"));
            }
        }
        for s in &series {
            for (label, value) in &s.labels {
                for secret in CLIENT_VALUES {
                    assert!(
                        !value.contains(secret),
                        "{port} {path}: {}{{{label}=\"{value}\"}} shows {secret:?}",
                        s.name
                    );
                }
                // Opted into by the config: the limit's stat key, as the reference names it.
                assert!(
                    !value.contains(DETAILED_USER) || *value == format!("user_{DETAILED_USER}"),
                    "{port} {path}: {}{{{label}=\"{value}\"}}",
                    s.name
                );
            }
        }
    }
    assert!(
        empty.is_empty(),
        "families with no series, so no client value was walked in them (give the test's \
         traffic, or its config, what makes them count): {empty:#?}"
    );
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
        for value in CLIENT_VALUES {
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
    let rlqs = RlqsStream::open(grpc);
    wait_for_series(http, "ratelimit_service_rlqs_limit_share");

    no_client_value_in_any_answer(http, debug, metrics);
    no_client_value_in_any_series(&[
        ("HTTP", http, "/metrics"),
        ("debug", debug, "/metrics"),
        ("Prometheus", metrics, "/metrics"),
    ]);
    // The RLQS series name the limit by the digest of its counter key, which holds the value.
    let m = http_get(http, "/metrics");
    let key = expected_digest(&format!("web_tenant_{RLQS_TENANT}_"));
    let want = format!("ratelimit_service_rlqs_limit_capacity{{domain=\"web\",key=\"{key}\"}} 20");
    assert!(m.contains(&want), "{want}\nnot in:\n{m}");
    drop(rlqs);

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
    for value in CLIENT_VALUES.iter().chain([&DETAILED_USER]) {
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
    // The RLQS series name the limit by its counter key, as sent.
    let rlqs = RlqsStream::open(grpc);
    wait_for_series(debug, "ratelimit_service_rlqs_limit_share");
    let m = http_get(debug, "/metrics");
    let want = format!(
        "ratelimit_service_rlqs_limit_capacity{{domain=\"web\",key=\"web_tenant_{RLQS_TENANT}_\"}} 20"
    );
    assert!(m.contains(&want), "{want}\nnot in:\n{m}");
    drop(rlqs);
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
