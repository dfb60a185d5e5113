//! The test fixtures, once each: the real server on port 0 with a manual clock and real clients
//! (here), every storage for one scenario (`storage`), Envoy in front of the binary (`envoy`),
//! Redis (`redis`), an xDS management server (`ads`), a temp dir (`tempdir`), Envoys with the
//! RLQS filter and paced load (`quota`).

pub mod ads;
pub mod binary;
pub mod envoy;
pub mod redis;
pub mod rlqs;
pub mod run;
pub mod storage;
pub mod tempdir;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use turnstile::config::{Config, LoadOptions};
use turnstile::limiter::{Clock, ManualClock};
use turnstile::server::{self, Running};
use turnstile::settings::Settings;

// What tests read of the crate besides the server, named here so that a move in src/ touches
// this file only.
#[allow(unused_imports)] // by the test files that do not read them
pub use turnstile::{limiter::BreakerState, service::WAITED_HEADER};

/// The envoyproxy/ratelimit-style config of the gRPC answers (`service::answers`) and of the counting
/// scenarios run on every storage (`storage::scenarios`).
pub const EDGE: &str = include_str!("edge.yaml");

/// 1_700_000_000 s: 20 s past a minute boundary, 800 s past an hour boundary.
pub const T0: u64 = 1_700_000_000 * 1_000_000_000;

pub struct TestServer {
    pub running: Option<Running>,
    pub clock: Arc<ManualClock>,
    pub client: RateLimitServiceClient<Channel>,
    pub http: String,
}

impl TestServer {
    pub async fn start(yaml: &str) -> TestServer {
        Self::start_with(yaml, &[]).await
    }

    /// Starts with `env` as the process environment would be (envoyproxy/ratelimit's variables).
    pub async fn start_with(yaml: &str, env: &[(&str, &str)]) -> TestServer {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_env(yaml, env).await
    }

    /// Starts with owned environment pairs (see [`TestServer::start_with`]).
    pub async fn start_env(yaml: &str, env: Vec<(String, String)>) -> TestServer {
        Self::try_start_env(yaml, env).await.expect("server starts")
    }

    /// As [`TestServer::start_env`], for tests of a start that must fail: the server's error.
    pub async fn try_start_env(
        yaml: &str,
        env: Vec<(String, String)>,
    ) -> Result<TestServer, String> {
        Self::try_start_files(&[("test.yaml", yaml)], env).await
    }

    /// Starts with a config of several files (one domain each), `(name, YAML)`.
    pub async fn start_files(files: &[(&str, &str)], env: &[(&str, &str)]) -> TestServer {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::try_start_files(files, env)
            .await
            .expect("server starts")
    }

    /// Starts as the binary does with `env` alone: the limits are read where the settings say
    /// (`RUNTIME_*`, GoCC's `CONFIG_FILE`) and watched there, not passed in.
    pub async fn start_from_env(env: &[(&str, &str)]) -> TestServer {
        let env: Vec<(String, String)> = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_from_env_owned(env).await
    }

    /// As [`TestServer::start_from_env`], with owned pairs.
    pub async fn start_from_env_owned(env: Vec<(String, String)>) -> TestServer {
        let settings = Self::settings(&env);
        let config = settings.sources().load().expect("valid config files");
        Self::try_start_config(settings, config)
            .await
            .expect("server starts")
    }

    /// Starts as the binary does over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW` in `env`): no limits
    /// until the management server pushes them, the overlay (`TURNSTILE_XDS_OVERLAY`) read at
    /// the start; the clock manual, as every test server's.
    pub async fn start_xds(env: &[(&str, &str)]) -> Result<TestServer, String> {
        let env: Vec<(String, String)> = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let settings = Self::settings(&env);
        Self::try_start_config(settings, Config::default()).await
    }

    fn settings(env: &[(String, String)]) -> Settings {
        let mut settings =
            Settings::from_env(|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
                .expect("valid test settings");
        settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
        settings.http_addr = "127.0.0.1:0".parse().unwrap();
        // The debug and Prometheus ports have fixed defaults; tests that want them set them.
        if !env.iter().any(|(k, _)| k == "DEBUG_PORT") {
            settings.debug_addr = None;
        }
        if !env.iter().any(|(k, _)| k == "PROMETHEUS_ADDR") {
            settings.prometheus = None;
        }
        // Several workers and shards, so multi-shard requests and cross-worker calls happen.
        if !env.iter().any(|(k, _)| k == "TURNSTILE_WORKERS") {
            (settings.workers, settings.shards) = layout();
        }
        settings
    }

    async fn try_start_files(
        files: &[(&str, &str)],
        env: Vec<(String, String)>,
    ) -> Result<TestServer, String> {
        let settings = Self::settings(&env);
        let sources: Vec<(String, String)> = (files.iter())
            .map(|(n, y)| (n.to_string(), y.to_string()))
            .collect();
        let config = Config::from_sources(&sources, settings.load).expect("valid test config");
        Self::try_start_config(settings, config).await
    }

    async fn try_start_config(settings: Settings, config: Config) -> Result<TestServer, String> {
        let (clock, manual) = Clock::manual(T0);
        // Boxed: the server's start is a deep future, and every test binary lays it out.
        let running = Box::pin(server::start(&settings, config, clock))
            .await
            .map_err(|e| e.to_string())?;
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("client connects");
        let http = format!("http://{}", running.http_addr);
        Ok(TestServer {
            running: Some(running),
            clock: manual,
            client,
            http,
        })
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("not shut down")
    }

    pub async fn call(&self, req: RateLimitRequest) -> RateLimitResponse {
        self.try_call(req).await.expect("call succeeds")
    }

    /// The call's answer, held to [`refused_by_a_status`] whatever the test asserts of it.
    pub async fn try_call(
        &self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let r = (self.client.clone().should_rate_limit(req).await).map(|r| r.into_inner());
        if let Ok(r) = &r {
            refused_by_a_status(r);
        }
        r
    }

    /// Sends `req` from a task of its own and returns once it waits in a queue (the shards'
    /// waiters grew by one; 5 s at most): its answer comes through the handle.
    pub async fn queued(
        &self,
        req: RateLimitRequest,
    ) -> tokio::task::JoinHandle<RateLimitResponse> {
        let waiting = || -> u64 {
            let stats = self.running().context.engine.stats().to_vec();
            stats.iter().map(|x| x.read().waiting).sum()
        };
        let before = waiting();
        let mut c = self.client.clone();
        let call =
            tokio::spawn(async move { c.should_rate_limit(req).await.unwrap().into_inner() });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while waiting() != before + 1 {
            assert!(tokio::time::Instant::now() < deadline, "not queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        call
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    pub async fn shutdown(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }
}

pub fn desc(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The one request builder: `descriptors` in `domain`, the request's `hits_addend` 0 (each
/// descriptor then counts one hit, unless it carries its own).
pub fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// `r` with the request's own `hits_addend` (every descriptor without its own counts `hits`).
pub fn with_hits(r: RateLimitRequest, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend: hits,
        ..r
    }
}

/// A descriptor carrying its own `hits_addend`, as Envoy sends for a rate limit with
/// `hits_addend` (0: the check before the request; n: the usage reported after it, counted in
/// full).
pub fn usage(pairs: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = desc(pairs);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d
}

/// A request of one such descriptor in `domain`: a usage report, or with 0 the check before.
pub fn report(domain: &str, pairs: &[(&str, &str)], hits: u64) -> RateLimitRequest {
    req(domain, vec![usage(pairs, hits)])
}

pub fn one(domain: &str, pairs: &[(&str, &str)]) -> RateLimitRequest {
    req(domain, vec![desc(pairs)])
}

pub const OK: i32 = 1;
pub const OVER: i32 = 2;

/// Envoy answers 429 on the overall code alone, so a refusal must be some status's: an
/// OVER_LIMIT answer with no OVER_LIMIT status is a limit that said OK (shadow mode) refusing
/// anyway. Every call of the harness is held to it, whatever its test asserts.
pub fn refused_by_a_status(r: &RateLimitResponse) {
    if r.overall_code == OVER {
        assert!(
            r.statuses.iter().any(|s| s.code == OVER),
            "OVER_LIMIT overall with no status over its limit: {r:?}"
        );
    }
}

/// (code, remaining) of every status.
pub fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

pub fn load(yaml: &str) -> Config {
    Config::from_sources(&[("t.yaml".into(), yaml.into())], LoadOptions::default()).unwrap()
}

/// The workers and shards a test server runs with unless the test says otherwise: 2 and 4, or
/// `TURNSTILE_TEST_LAYOUT=WxS` (scripts/test.sh runs the black-box suites again with `3x8`, the
/// default layout of a bigger machine).
pub fn layout() -> (usize, usize) {
    let parsed = std::env::var("TURNSTILE_TEST_LAYOUT").ok().and_then(|l| {
        let (w, s) = l.split_once('x')?;
        Some((w.trim().parse().ok()?, s.trim().parse().ok()?))
    });
    parsed.unwrap_or((2, 4))
}

/// What `f` answers once it answers `want`, or its last answer when `within` has passed, polled
/// every 10 ms: for state the server changes on another thread (health after a reload).
pub async fn settles<T: PartialEq, F: std::future::Future<Output = T>>(
    mut f: impl FnMut() -> F,
    want: T,
    within: Duration,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        let got = f().await;
        if got == want || std::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The sum of a family's samples over its labels (per shard, say) in the native exposition at
/// `http://{addr}/metrics`; 0 when the family has none.
pub async fn family_sum(addr: impl std::fmt::Display, family: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("/metrics text");
    let labelled = format!("{family}{{");
    (text.lines())
        .filter(|l| l.starts_with(&labelled) || l.starts_with(&format!("{family} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
