//! The statsd and DogStatsD push of the real server, read by a real UDP (or TCP) listener in the
//! test: envoyproxy/ratelimit's names, the counts after known traffic, EXTRA_TAGS folded into
//! names (statsd) or as tags (DogStatsD), the mogrifiers, and a dead statsd costing no answer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UdpSocket};
use turnstile::config::Config;
use turnstile::limiter::Clock;
use turnstile::server::{self, Running};
use turnstile::settings::Settings;

const DEADLINE: Duration = Duration::from_secs(20);
const T0: u64 = 1_700_000_000 * 1_000_000_000;
const CONFIG: &str = "domain: m
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 5}
";

async fn start(env: &[(&str, &str)]) -> Running {
    let mut s = Settings::from_env(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    s.grpc_addr = "127.0.0.1:0".parse().unwrap();
    s.http_addr = "127.0.0.1:0".parse().unwrap();
    s.debug_addr = None;
    s.prometheus = s.prometheus.map(|mut p| {
        p.addr = "127.0.0.1:0".parse().unwrap();
        p
    });
    s.workers = 1;
    s.shards = 1;
    let config = Config::from_sources(&[("m.yaml".into(), CONFIG.into())], s.load).unwrap();
    let (clock, _manual) = Clock::manual(T0);
    server::start(&s, config, clock).await.expect("starts")
}

/// `n` calls on `key=value`; returns how many were refused.
async fn traffic(r: &Running, key: &str, value: &str, n: usize) -> usize {
    let mut c = RateLimitServiceClient::connect(format!("http://{}", r.grpc_addr))
        .await
        .unwrap();
    let mut refused = 0;
    for _ in 0..n {
        let req = crate::common::one("m", &[(key, value)]);
        let resp = c.should_rate_limit(req).await.unwrap().into_inner();
        refused += usize::from(resp.overall_code == 2);
    }
    refused
}

/// Counter lines summed by name and tags (`name|#tags` for DogStatsD), and every line seen.
#[derive(Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    lines: Vec<String>,
}

impl Seen {
    fn add(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.is_empty()) {
            self.lines.push(line.to_owned());
            let Some((name, rest)) = line.split_once(':') else {
                panic!("not a statsd line: {line:?}");
            };
            let mut parts = rest.split('|');
            let value = parts.next().unwrap();
            if parts.next() != Some("c") {
                continue;
            }
            let tags = parts.find_map(|p| p.strip_prefix('#'));
            let key = match tags {
                Some(t) => format!("{name}|#{t}"),
                None => name.to_owned(),
            };
            *self.counters.entry(key).or_default() += value.parse::<u64>().unwrap();
        }
    }

    fn has(&self, want: &[(&str, u64)]) -> bool {
        want.iter()
            .all(|(k, v)| self.counters.get(*k).copied() == Some(*v))
    }
}

/// Reads datagrams until every `want` counter has summed to its value.
async fn udp_until(socket: &UdpSocket, want: &[(&str, u64)]) -> Seen {
    let mut seen = Seen::default();
    let end = Instant::now() + DEADLINE;
    let mut buf = vec![0u8; 65_536];
    while !seen.has(want) {
        let left = end.saturating_duration_since(Instant::now());
        let Ok(got) = tokio::time::timeout(left, socket.recv(&mut buf)).await else {
            panic!("statsd never reached {want:?}; saw {:?}", seen.counters);
        };
        let n = got.unwrap();
        assert!(n <= 1432, "a datagram of {n} bytes");
        seen.add(std::str::from_utf8(&buf[..n]).unwrap());
    }
    seen
}

#[tokio::test]
async fn statsd_names_and_counts_with_extra_tags_over_udp() {
    let listener = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let r = start(&[
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "50ms"),
        ("EXTRA_TAGS", "pod:rl-1.a,zone:eu"),
    ])
    .await;
    // 7 hits on a limit of 5: 5 within, 2 over.
    assert_eq!(traffic(&r, "k", "", 7).await, 2);
    assert_eq!(traffic(&r, "ip", "10.0.0.1", 1).await, 0);
    let tags = ".__pod=rl-1_a.__zone=eu";
    let name = |s: &str| format!("{s}{tags}");
    let want = [
        (name("ratelimit.service.rate_limit.m.k.total_hits"), 7),
        (name("ratelimit.service.rate_limit.m.k.within_limit"), 5),
        (name("ratelimit.service.rate_limit.m.k.over_limit"), 2),
        (name("ratelimit.service.rate_limit.m.ip.total_hits"), 1),
        (name("ratelimit_server.ShouldRateLimit.total_requests"), 8),
    ];
    let want: Vec<(&str, u64)> = want.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let seen = udp_until(&listener, &want).await;
    assert!(
        seen.lines.iter().any(|l| l
            .starts_with("ratelimit_server.ShouldRateLimit.response_time.__pod=rl-1_a.__zone=eu:")
            && l.contains("|ms")),
        "{:?}",
        seen.lines
    );
    r.shutdown().await;
}

#[tokio::test]
async fn dogstatsd_tags_and_mogrifiers() {
    let listener = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let r = start(&[
        ("USE_DOG_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
        ("STATS_FLUSH_INTERVAL", "50ms"),
        ("EXTRA_TAGS", "zone:eu"),
        // The reference README's example.
        ("USE_DOG_STATSD_MOGRIFIERS", "HITS"),
        (
            "DOG_STATSD_MOGRIFIER_HITS_PATTERN",
            r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
        ),
        (
            "DOG_STATSD_MOGRIFIER_HITS_NAME",
            "ratelimit.service.rate_limit.$3",
        ),
        ("DOG_STATSD_MOGRIFIER_HITS_TAGS", "domain:$1,descriptor:$2"),
    ])
    .await;
    assert_eq!(traffic(&r, "k", "", 6).await, 1);
    let tags = "zone:eu,descriptor:k,domain:m";
    let want = [
        (
            format!("ratelimit.service.rate_limit.total_hits|#{tags}"),
            6,
        ),
        (
            format!("ratelimit.service.rate_limit.over_limit|#{tags}"),
            1,
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests|#zone:eu".into(),
            6,
        ),
    ];
    let want: Vec<(&str, u64)> = want.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    udp_until(&listener, &want).await;
    r.shutdown().await;
}

#[tokio::test]
async fn statsd_over_tcp_by_default_as_gostats() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let r = start(&[
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
        ("STATS_FLUSH_INTERVAL", "50ms"),
    ])
    .await;
    assert_eq!(traffic(&r, "k", "", 3).await, 0);
    let (mut conn, _) = tokio::time::timeout(DEADLINE, listener.accept())
        .await
        .expect("statsd connects")
        .unwrap();
    let mut seen = Seen::default();
    let mut text = String::new();
    let mut buf = vec![0u8; 65_536];
    let want = [("ratelimit.service.rate_limit.m.k.total_hits", 3)];
    while !seen.has(&want) {
        let n = tokio::time::timeout(DEADLINE, conn.read(&mut buf))
            .await
            .expect("statsd writes")
            .unwrap();
        assert!(n > 0, "statsd closed; saw {:?}", seen.counters);
        text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        // Whole lines only: a read may end mid-line.
        let cut = text.rfind('\n').map_or(0, |i| i + 1);
        seen.add(&text[..cut]);
        text.drain(..cut);
    }
    r.shutdown().await;
}

#[tokio::test]
async fn a_dead_statsd_costs_no_answer_and_is_counted() {
    // A port nothing listens on: every TCP flush fails.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port().to_string();
    drop(dead);
    let r = start(&[
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
        ("STATS_FLUSH_INTERVAL", "10ms"),
    ])
    .await;
    assert_eq!(traffic(&r, "k", "", 6).await, 1);
    let url = format!("http://{}/metrics", r.http_addr);
    let end = Instant::now() + DEADLINE;
    loop {
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        let errors = text
            .lines()
            .find_map(|l| l.strip_prefix("ratelimit_service_statsd_errors_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if errors > 0 {
            break;
        }
        assert!(Instant::now() < end, "no failed flush counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.shutdown().await;
}
