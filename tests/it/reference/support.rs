//! What the ported cases share: servers started at any time (the reference's tests run their
//! mocked clock at 1234 s and 1 000 000 s), servers reading a config directory (reloads), the
//! expected statuses built as envoyproxy/ratelimit builds them, and stats read from the
//! Prometheus text by the reference's dotted stat names.

use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use turnstile::config::Config;
use turnstile::limiter::Clock;
use turnstile::server;
use turnstile::settings::Settings;

use crate::common::{layout, TestServer};

pub const SECOND: Unit = Unit::Second;
pub const MINUTE: Unit = Unit::Minute;
pub const HOUR: Unit = Unit::Hour;
pub const DAY: Unit = Unit::Day;

/// `utils.CalculateReset` of the reference: the seconds left in the unit's window at `now`.
pub fn reset(unit: Unit, now: u64) -> i64 {
    let div = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        other => panic!("unit {other:?} not used by the ported tests"),
    };
    (div - now % div) as i64
}

/// A status as the reference builds it for a descriptor with a limit (`newDescriptorStatus`
/// of integration_test.go, the cache's statuses of fixed_cache_impl_test.go).
pub fn limited(code: i32, rpu: u32, unit: Unit, remaining: u32, reset_s: i64) -> DescriptorStatus {
    named(code, "", rpu, unit, remaining, reset_s)
}

/// [`limited`] for a limit with a `name`.
pub fn named(
    code: i32,
    name: &str,
    rpu: u32,
    unit: Unit,
    remaining: u32,
    reset_s: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(PbDuration {
            seconds: reset_s,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// A descriptor without a limit: `{Code: OK, CurrentLimit: nil, LimitRemaining: 0}`.
pub fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: crate::common::OK,
        ..Default::default()
    }
}

/// `common.NewRateLimitRequest(domain, descriptors, hitsAddend)`.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    let descriptors = descriptors.iter().map(|d| crate::common::desc(d)).collect();
    crate::common::with_hits(crate::common::req(domain, descriptors), hits)
}

/// `common.NewRateLimitRequestWithPerDescriptorHitsAddend`: request hits 1, each descriptor
/// its own `hits_addend`.
pub fn request_per_descriptor(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: &[u64],
) -> RateLimitRequest {
    let mut r = request(domain, descriptors, 1);
    for (d, h) in r.descriptors.iter_mut().zip(hits) {
        d.hits_addend = Some(UInt64Value { value: *h });
    }
    r
}

fn settings_from(env: &[(String, String)]) -> Settings {
    let mut s = Settings::from_env(|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        .expect("valid test settings");
    s.grpc_addr = "127.0.0.1:0".parse().unwrap();
    s.http_addr = "127.0.0.1:0".parse().unwrap();
    s.debug_addr = None;
    s.prometheus = None;
    (s.workers, s.shards) = layout();
    s
}

fn owned(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn connect(
    running: server::Running,
    clock: std::sync::Arc<turnstile::limiter::ManualClock>,
) -> TestServer {
    let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .expect("client connects");
    let http = format!("http://{}", running.http_addr);
    TestServer {
        running: Some(running),
        clock,
        client,
        http,
    }
}

/// The real server on port 0, its manual clock at `now_s` seconds, `yaml` as its one file.
pub async fn start_at(now_s: u64, yaml: &str, env: &[(&str, &str)]) -> TestServer {
    start_at_env(now_s, yaml, owned(env)).await
}

pub async fn start_at_env(now_s: u64, yaml: &str, env: Vec<(String, String)>) -> TestServer {
    let s = settings_from(&env);
    let config = Config::from_sources(&[("test.yaml".into(), yaml.into())], s.load)
        .expect("valid test config");
    let (clock, manual) = Clock::manual(now_s * 1_000_000_000);
    let running = server::start(&s, config, clock).await.expect("starts");
    connect(running, manual).await
}

/// The real server reading the config directory `dir` (reloads with
/// [`server::Running::reload_config`], as SIGHUP or the directory poll do), clock at `now_s`.
pub async fn start_dir(now_s: u64, dir: &Path, env: &[(&str, &str)]) -> TestServer {
    let mut s = settings_from(&owned(env));
    s.config_path = dir.to_path_buf();
    let config = Config::load(&s.config_path, s.load).expect("initial config loads");
    let (clock, manual) = Clock::manual(now_s * 1_000_000_000);
    let running = server::start(&s, config, clock).await.expect("starts");
    connect(running, manual).await
}

pub async fn http_get(url: &str) -> (u16, String) {
    let r = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The Prometheus text of the server's HTTP port.
pub async fn metrics(s: &TestServer) -> String {
    let (code, body) = http_get(&format!("{}/metrics", s.http)).await;
    assert_eq!(code, 200);
    body
}

/// The value of an exact series (name with labels), if exposed.
pub fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A per-limit stat by the reference's dotted name, `domain.key_value.key2` + `total_hits`
/// (`ratelimit.service.rate_limit.<domain>.<path>.<stat>`), as turnstile exposes it:
/// `ratelimit_service_rate_limit_<stat>{domain="<domain>",descriptor="<path>"}`. Absent: 0
/// is never assumed, the caller sees `None`.
pub fn stat(text: &str, stat_key: &str, name: &str) -> Option<u64> {
    let (domain, path) = stat_key.split_once('.').expect("domain.path");
    series(
        text,
        &format!(
            "ratelimit_service_rate_limit_{name}{{domain=\"{domain}\",descriptor=\"{path}\"}}"
        ),
    )
    .map(|v| v as u64)
}

/// A stat that must be exposed: its value.
pub fn must(text: &str, stat_key: &str, name: &str) -> u64 {
    stat(text, stat_key, name).unwrap_or_else(|| {
        let family = format!("ratelimit_service_rate_limit_{name}{{");
        let have: Vec<&str> = text.lines().filter(|l| l.starts_with(&family)).collect();
        panic!(
            "no series for {stat_key}.{name}; exposed:\n{}",
            have.join("\n")
        )
    })
}

/// The sum of a per-shard family.
pub fn shard_sum(text: &str, family: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{shard=")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Polls the server's metrics until `name` reaches `at_least` (a directory poll is
/// asynchronous); the last text after the deadline.
pub async fn wait_series(s: &TestServer, name: &str, at_least: f64) -> String {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(s).await;
        if series(&m, name).is_some_and(|v| v >= at_least) {
            return m;
        }
        assert!(Instant::now() < end, "{name} never reached {at_least}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The real server with several config files `(name, YAML)`, its clock at `now_s`.
pub async fn start_files_at(
    now_s: u64,
    files: &[(&str, &str)],
    env: &[(&str, &str)],
) -> TestServer {
    let s = settings_from(&owned(env));
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(n, y)| (n.to_string(), y.to_string()))
        .collect();
    let config = Config::from_sources(&sources, s.load).expect("valid test config");
    let (clock, manual) = Clock::manual(now_s * 1_000_000_000);
    let running = server::start(&s, config, clock).await.expect("starts");
    connect(running, manual).await
}
