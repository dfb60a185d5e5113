//! turnstile's own metrics after known traffic, scraped from the debug port and the HTTP port of
//! the real server: per-limit stats, errors by kind, the latency histogram, queue gauges, config
//! loads; and the bounded `detailed_metric` series. The Prometheus port's path and switch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;
use turnstile::config::{Config, LoadOptions};
use turnstile::hitters::TopTable;
use turnstile::limiter::{Clock, ManualClock};
use turnstile::server::{self, Running};
use turnstile::service::metrics::{Counted, RequestStats};
use turnstile::service::LiveLimits;
use turnstile::settings::{PrometheusSettings, Settings};
use turnstile::telemetry::{Metrics, Registry};

const DEADLINE: Duration = Duration::from_secs(20);
/// 20 s into a minute: minute windows do not roll over while the clock moves 1 s.
const T0: u64 = 1_700_000_000 * 1_000_000_000;

const CONFIG: &str = "domain: m
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q
    rate_limit:
      unit: second
      requests_per_unit: 1
      queue: {max_waiting: 5, max_wait: 10s}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
";

fn settings(env: &[(&str, &str)]) -> Settings {
    let mut s = Settings::from_env(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    s.grpc_addr = "127.0.0.1:0".parse().unwrap();
    s.http_addr = "127.0.0.1:0".parse().unwrap();
    s.debug_addr = Some("127.0.0.1:0".parse().unwrap());
    if let Some(p) = &mut s.prometheus {
        p.addr = "127.0.0.1:0".parse().unwrap();
    }
    s.workers = 2;
    s.shards = 2;
    s
}

async fn start(s: &Settings) -> (Running, Arc<ManualClock>, RateLimitServiceClient<Channel>) {
    let config = Config::from_sources(&[("m.yaml".into(), CONFIG.into())], s.load).unwrap();
    let (clock, manual) = Clock::manual(T0);
    let r = server::start(s, config, clock).await.expect("starts");
    let c = RateLimitServiceClient::connect(format!("http://{}", r.grpc_addr))
        .await
        .unwrap();
    (r, manual, c)
}

fn req(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    crate::common::one(domain, &[(key, value)])
}

async fn get(url: String) -> String {
    let resp = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(resp.status(), 200, "GET {url}");
    resp.text().await.unwrap()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn limit_stat(text: &str, stat: &str, descriptor: &str) -> Option<f64> {
    metric(
        text,
        &format!("ratelimit_service_rate_limit_{stat}{{domain=\"m\",descriptor=\"{descriptor}\"}}"),
    )
}

/// Every sample line is `name{labels} number`, every family has HELP and TYPE, no series twice.
fn assert_valid_exposition(text: &str) {
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                "{line}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        assert!(value.parse::<f64>().is_ok(), "bad value: {line}");
        let name = series.split('{').next().unwrap();
        let family = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_sum"))
            .or_else(|| name.strip_suffix("_count"))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "no TYPE for {line}"
        );
        assert!(seen.insert(series.to_owned()), "series twice: {series}");
    }
}

#[tokio::test]
async fn metrics_after_known_traffic() {
    let s = settings(&[]);
    let (r, clock, mut c) = start(&s).await;
    // turnstile's own series: the debug port's (the Prometheus port serves the reference's).
    let prom = format!("http://{}/metrics", r.debug_addr.expect("debug port"));

    // 6 hits on a limit of 5: 5 within (the 5th is near: above floor(5 × 0.8) = 4), 1 over.
    for _ in 0..6 {
        c.should_rate_limit(req("m", "k", "alice")).await.unwrap();
    }
    // Shadow mode: the 2nd is over the limit but answered OK.
    for _ in 0..2 {
        c.should_rate_limit(req("m", "shadow", "x")).await.unwrap();
    }
    // Bad input: an error of kind invalid_argument.
    let e = c.should_rate_limit(req("", "k", "x")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // Queue: the 2nd call in the second waits; the gauge shows it until the clock moves.
    c.should_rate_limit(req("m", "q", "job")).await.unwrap();
    let mut waiter_client = c.clone();
    let waiter =
        tokio::spawn(async move { waiter_client.should_rate_limit(req("m", "q", "job")).await });
    let end = Instant::now() + DEADLINE;
    loop {
        let m = get(prom.clone()).await;
        let waiting: f64 = (0..2)
            .filter_map(|i| {
                metric(
                    &m,
                    &format!("ratelimit_service_queue_waiting{{shard=\"{i}\"}}"),
                )
            })
            .sum();
        if waiting == 1.0 {
            break;
        }
        assert!(Instant::now() < end, "no waiter in the gauge:\n{m}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.advance(Duration::from_secs(1));
    let answered = waiter.await.unwrap().expect("admitted after the wait");
    assert_eq!(answered.into_inner().overall_code, 1);

    let m = get(prom.clone()).await;
    assert_valid_exposition(&m);
    assert_eq!(limit_stat(&m, "total_hits", "k"), Some(6.0), "{m}");
    assert_eq!(limit_stat(&m, "within_limit", "k"), Some(5.0));
    assert_eq!(limit_stat(&m, "over_limit", "k"), Some(1.0));
    assert_eq!(limit_stat(&m, "near_limit", "k"), Some(1.0));
    assert_eq!(limit_stat(&m, "shadow_mode", "shadow"), Some(1.0));
    assert_eq!(limit_stat(&m, "total_hits", "shadow"), Some(2.0));
    assert_eq!(limit_stat(&m, "total_hits", "q"), Some(2.0));
    assert_eq!(
        metric(
            &m,
            "ratelimit_service_errors_total{door=\"envoy\",kind=\"invalid_argument\"}"
        ),
        Some(1.0)
    );
    // 6 + 2 + 1 + 2 calls, every one in the histogram.
    assert_eq!(
        metric(&m, "ratelimit_service_requests_total{door=\"envoy\"}"),
        Some(11.0)
    );
    assert_eq!(
        metric(
            &m,
            "ratelimit_service_request_duration_seconds_count{door=\"envoy\"}"
        ),
        Some(11.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "ratelimit_service_request_duration_seconds_bucket{door=\"envoy\",le=\"+Inf\"}"
        ),
        Some(11.0)
    );
    // The waiter waited for a manual clock the test moved, in real time a few ms at least.
    assert!(
        metric(
            &m,
            "ratelimit_service_request_duration_seconds_sum{door=\"envoy\"}"
        )
        .unwrap()
            > 0.0
    );
    let sum_over = |name: &str| -> f64 {
        (0..2)
            .filter_map(|i| metric(&m, &format!("{name}{{shard=\"{i}\"}}")))
            .sum()
    };
    assert_eq!(sum_over("ratelimit_service_queue_waiting"), 0.0);
    assert_eq!(sum_over("ratelimit_service_queue_queued_total"), 1.0);
    assert_eq!(
        sum_over("ratelimit_service_queue_admitted_after_wait_total"),
        1.0
    );
    assert!(sum_over("ratelimit_service_shard_keys") >= 3.0, "{m}");
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_success_total"),
        Some(1.0)
    );
    assert!(
        metric(
            &m,
            "ratelimit_service_config_last_load_success_timestamp_seconds"
        )
        .unwrap()
            > 0.0
    );

    // The same exposition on the debug port and on the HTTP port.
    for url in [
        format!("http://{}/metrics", r.debug_addr.unwrap()),
        format!("http://{}/metrics", r.http_addr),
    ] {
        let other = get(url).await;
        assert_eq!(limit_stat(&other, "total_hits", "k"), Some(6.0), "{other}");
        assert!(other.contains("ratelimit_service_request_duration_seconds_bucket"));
    }
    r.shutdown().await;
}

#[tokio::test]
async fn prometheus_path_and_switch() {
    let s = settings(&[("PROMETHEUS_PATH", "/custom/metrics")]);
    let (r, _clock, _c) = start(&s).await;
    let addr = r.prometheus_addr.unwrap();
    let body = get(format!("http://{addr}/custom/metrics")).await;
    assert!(
        body.contains("ratelimit_service_config_load_success 1\n"),
        "{body}"
    );
    let status = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    r.shutdown().await;

    let s = settings(&[("USE_PROMETHEUS", "false")]);
    assert!(s.prometheus.is_none());
    let (r, _clock, _c) = start(&s).await;
    assert!(r.prometheus_addr.is_none());
    // Off everywhere (docs/settings.md): the debug and HTTP ports serve no series either.
    for addr in [r.debug_addr.unwrap(), r.http_addr] {
        let status = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .status();
        assert_eq!(status, 404, "{addr}");
    }
    r.shutdown().await;
}

#[test]
fn prometheus_settings_defaults() {
    let s = Settings::from_env(|_| None).unwrap();
    let p: &PrometheusSettings = s.prometheus.as_ref().expect("on by default");
    assert_eq!(p.addr, "0.0.0.0:9090".parse().unwrap());
    assert_eq!(p.path, "/metrics");
    assert_eq!(s.debug_addr, Some("0.0.0.0:6070".parse().unwrap()));
    let s =
        Settings::from_env(|k| (k == "PROMETHEUS_ADDR").then(|| "127.0.0.1:9999".into())).unwrap();
    assert_eq!(
        s.prometheus.unwrap().addr,
        "127.0.0.1:9999".parse().unwrap()
    );
}

fn counted(hits: u64, over: bool, remaining: u32, limit: u32) -> Counted {
    Counted {
        hits,
        over,
        shadow: false,
        remaining,
        limit,
        // Over: every hit is past the limit.
        past: if over { u64::MAX } else { 0 },
    }
}

/// The `detailed_metric` API the service calls: one series per value, up to the cap, then
/// the domain's `_other` series; the node's own series makes way for them.
#[test]
fn detailed_series_are_bounded() {
    let config =
        Config::from_sources(&[("m.yaml".into(), CONFIG.into())], LoadOptions::default()).unwrap();
    let m = Arc::new(RequestStats::new(0.8).with_max_detailed_series(2));
    let live = LiveLimits::new(config, m.clone(), Arc::new(TopTable::new(0)));
    let registry = Registry::new(vec![Arc::new(live) as Arc<dyn Metrics>]);
    for (v, n) in [("alice", 3), ("bob", 1), ("carol", 1), ("dave", 2)] {
        for _ in 0..n {
            m.record_series("m", &format!("user_{v}"), counted(1, false, 5, 10));
        }
    }
    // Over the limit once: counted as over, not within.
    m.record_series("m", "user_alice", counted(1, true, 0, 10));
    let text = registry.render(turnstile::telemetry::Shown::Clear);
    assert_valid_exposition(&text);
    assert_eq!(
        limit_stat(&text, "total_hits", "user_alice"),
        Some(4.0),
        "{text}"
    );
    assert_eq!(limit_stat(&text, "over_limit", "user_alice"), Some(1.0));
    assert_eq!(limit_stat(&text, "total_hits", "user_bob"), Some(1.0));
    assert_eq!(limit_stat(&text, "total_hits", "user_carol"), None);
    assert_eq!(limit_stat(&text, "total_hits", "_other"), Some(3.0));
    assert_eq!(
        metric(&text, "ratelimit_service_detailed_metric_overflow_total"),
        Some(3.0)
    );
    assert_eq!(
        metric(&text, "ratelimit_service_detailed_metric_series"),
        Some(3.0)
    );
    assert_eq!(m.detailed.overflow.load(Ordering::Relaxed), 3);
}

/// A limit's gauge series, labelled as its hit series plus `limit`.
fn limit_gauge(text: &str, family: &str, descriptor: &str, limit: &str) -> Option<f64> {
    metric(
        text,
        &format!(
            "ratelimit_service_rate_limit_{family}{{domain=\"m\",descriptor=\"{descriptor}\",limit=\"{limit}\"}}"
        ),
    )
}

#[tokio::test]
async fn limits_are_gauges_that_follow_reloads() {
    let s = settings(&[]);
    let (r, _clock, _c) = start(&s).await;
    let prom = format!("http://{}/metrics", r.debug_addr.expect("debug port"));
    let m = get(prom.clone()).await;
    assert_valid_exposition(&m);
    assert_eq!(
        limit_gauge(&m, "requests_per_unit", "k", "0"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(limit_gauge(&m, "unit_seconds", "k", "0"), Some(60.0));
    assert_eq!(limit_gauge(&m, "unit_seconds", "q", "0"), Some(1.0));
    assert_eq!(limit_gauge(&m, "queue_max_waiting", "q", "0"), Some(5.0));
    assert_eq!(
        limit_gauge(&m, "queue_max_wait_seconds", "q", "0"),
        Some(10.0)
    );
    assert_eq!(limit_gauge(&m, "queue_max_waiting", "k", "0"), None);
    assert_eq!(limit_gauge(&m, "burst", "k", "0"), None);

    // A reload (the one install path files, SIGHUP and xDS share) changes k, adds a named
    // token bucket beside it and removes the others: the gauges follow, nothing stale stays.
    let next = "domain: m
descriptors:
  - key: k
    rate_limits:
      - {unit: hour, requests_per_unit: 7}
      - {name: burst, unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
      - {name: five, unit: minute, unit_multiplier: 5, requests_per_unit: 100}
";
    let config = Config::from_sources(&[("m.yaml".into(), next.into())], s.load).unwrap();
    r.context.live.install(config);
    let m = get(prom).await;
    assert_valid_exposition(&m);
    assert_eq!(
        limit_gauge(&m, "requests_per_unit", "k", "0"),
        Some(7.0),
        "{m}"
    );
    assert_eq!(limit_gauge(&m, "unit_seconds", "k", "0"), Some(3600.0));
    assert_eq!(
        limit_gauge(&m, "requests_per_unit", "k", "burst"),
        Some(2.0)
    );
    assert_eq!(limit_gauge(&m, "burst", "k", "burst"), Some(4.0));
    // The window's length: the allowed rate is requests_per_unit / unit_seconds.
    assert_eq!(limit_gauge(&m, "unit_seconds", "k", "five"), Some(300.0));
    assert_eq!(limit_gauge(&m, "requests_per_unit", "q", "0"), None);
    assert!(!m.contains("descriptor=\"q\",limit"), "{m}");
    r.shutdown().await;
}
