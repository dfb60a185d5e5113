//! Hot reload against the real server: a good config goes live with its stats and counters
//! kept, a bad one is refused whole, a Kubernetes ConfigMap `..data` swap and a runtime-root
//! symlink swap are seen, dotfiles are ignored, and `reload_config` (what SIGHUP calls) works
//! with polling off. Tests wait on `/rlconfig` or the load counters, with a deadline.

use crate::common::binary::{
    self, block_on, configmap, configmap_update, http_get, request, wait_for, Server, BIN,
};
use crate::common::settles;
use crate::common::tempdir::TempDir;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use turnstile::config::Config;
use turnstile::limiter::Clock;
use turnstile::server::{self, Running};
use turnstile::settings::Settings;

const DEADLINE: Duration = Duration::from_secs(20);
const T0: u64 = 1_700_000_000 * 1_000_000_000;

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Loopback, OS-chosen ports, a 50 ms poll, the config at `config_path`.
fn settings(config_path: &Path, env: &[(&str, &str)]) -> Settings {
    let mut s = Settings::from_env(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    s.config_path = config_path.to_path_buf();
    s.grpc_addr = "127.0.0.1:0".parse().unwrap();
    s.http_addr = "127.0.0.1:0".parse().unwrap();
    s.debug_addr = Some("127.0.0.1:0".parse().unwrap());
    if let Some(p) = &mut s.prometheus {
        p.addr = "127.0.0.1:0".parse().unwrap();
    }
    if !env
        .iter()
        .any(|(k, _)| *k == "TURNSTILE_RELOAD_INTERVAL_MS")
    {
        s.reload_interval = Duration::from_millis(50);
    }
    s.workers = 2;
    s.shards = 2;
    s
}

async fn start(s: &Settings) -> Running {
    let config = Config::load(&s.config_path, s.load).expect("initial config loads");
    let (clock, _manual) = Clock::manual(T0);
    server::start(s, config, clock)
        .await
        .expect("server starts")
}

async fn get(url: String) -> String {
    reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap()
}

async fn rlconfig(r: &Running) -> String {
    get(format!("http://{}/rlconfig", r.debug_addr.unwrap())).await
}

/// turnstile's own series, on the debug port.
async fn metrics(r: &Running) -> String {
    get(format!("http://{}/metrics", r.debug_addr.unwrap())).await
}

/// The value of the series `name` (with labels, exactly as exposed).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Polls `/rlconfig` until `pred` holds; panics with the last body after the deadline.
async fn wait_rlconfig(r: &Running, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + DEADLINE;
    loop {
        let body = rlconfig(r).await;
        if pred(&body) {
            return body;
        }
        assert!(Instant::now() < end, "{what}: /rlconfig still\n{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_metric(r: &Running, name: &str, at_least: f64) -> String {
    let end = Instant::now() + DEADLINE;
    loop {
        let body = metrics(r).await;
        if metric(&body, name).is_some_and(|v| v >= at_least) {
            return body;
        }
        assert!(
            Instant::now() < end,
            "{name} never reached {at_least}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call(r: &Running, domain: &str, key: &str, value: &str) -> RateLimitResponse {
    let mut c = RateLimitServiceClient::connect(format!("http://{}", r.grpc_addr))
        .await
        .unwrap();
    c.should_rate_limit(crate::common::one(domain, &[(key, value)]))
        .await
        .expect("call succeeds")
        .into_inner()
}

fn limit(r: &RateLimitResponse) -> Option<u32> {
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

const V1: &str = "domain: shop
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5}
";

const V2: &str = "domain: shop
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 1}
";

const BAD: &str = "domain: shop
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 10}
";

#[tokio::test]
async fn good_reload_goes_live_and_keeps_stats_and_counters() {
    let t = TempDir::new("good");
    let file = t.path().join("config/limits.yaml");
    write(&file, V1);
    // Every admitted hit counted in the heavy hitters, so their counts below are exact.
    let s = settings(&t.path().join("config"), &[("TURNSTILE_TOP_SAMPLE", "1")]);
    let r = start(&s).await;
    for _ in 0..3 {
        call(&r, "shop", "a", "x").await;
    }
    assert_eq!(
        call(&r, "shop", "b", "x").await.statuses[0].limit_remaining,
        4
    );

    write(&file, V2);
    let body = wait_rlconfig(&r, "new limit c", |b| b.contains("shop.c:")).await;
    assert!(
        body.contains("shop.b: unit=MINUTE requests_per_unit=7"),
        "{body}"
    );

    // The new limit answers; `a`'s counter went on where it was (3 used, now the 4th).
    assert_eq!(limit(&call(&r, "shop", "b", "x").await), Some(7));
    assert_eq!(
        call(&r, "shop", "c", "x").await.statuses[0].limit_remaining,
        0
    );
    assert_eq!(
        call(&r, "shop", "a", "x").await.statuses[0].limit_remaining,
        6
    );

    let m = metrics(&r).await;
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_success_total"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_error_total"),
        Some(0.0)
    );
    // Stats survive the reload: 3 hits before it, 1 after.
    assert_eq!(
        metric(
            &m,
            "ratelimit_service_rate_limit_total_hits{domain=\"shop\",descriptor=\"a\"}"
        ),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "ratelimit_service_rate_limit_total_hits{domain=\"shop\",descriptor=\"b\"}"
        ),
        Some(2.0),
        "{m}"
    );
    // So do the heavy hitters, bound by stat key like the stats.
    let top = debug_json(&r, "/debug/top?limit=shop.a").await;
    let a = &top["limits"][0]["by_hits"][0];
    assert_eq!(
        (a["value"].as_str(), a["hits"].as_u64()),
        (Some("a=x"), Some(4)),
        "{top}"
    );
    r.shutdown().await;
}

async fn debug_json(r: &Running, path: &str) -> serde_json::Value {
    let body = get(format!("http://{}{path}", r.debug_addr.unwrap())).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

#[tokio::test]
async fn bad_reload_is_refused_and_the_old_config_still_answers() {
    let t = TempDir::new("bad");
    let dir = t.path().join("config");
    write(&dir.join("limits.yaml"), V1);
    let s = settings(&dir, &[]);
    let r = start(&s).await;
    let before = rlconfig(&r).await;

    write(&dir.join("limits.yaml"), BAD);
    let m = wait_metric(&r, "ratelimit_service_config_load_error_total", 1.0).await;
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_success_total"),
        Some(1.0)
    );
    assert_eq!(rlconfig(&r).await, before);
    let resp = call(&r, "shop", "a", "x").await;
    assert_eq!(limit(&resp), Some(10));
    assert_eq!(resp.statuses[0].limit_remaining, 9);
    // The status page's source says which load was refused and why, and what stays live.
    let status = debug_json(&r, "/debug/status").await;
    let config = &status["config"];
    let error = config["last_attempt"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("fortnight"), "{config}");
    assert_eq!(config["live"]["error"], serde_json::Value::Null, "{config}");
    assert_eq!(
        (config["loads"].as_u64(), config["load_errors"].as_u64()),
        (Some(1), Some(1))
    );

    // Fixed, it loads.
    write(&dir.join("limits.yaml"), V2);
    wait_rlconfig(&r, "fixed config", |b| b.contains("shop.c:")).await;
    r.shutdown().await;
}

/// A ConfigMap volume: `a.yaml -> ..data/a.yaml`, `..data -> ..v1`; kubelet writes `..v2` and
/// renames a new `..data` symlink over the old one.
#[tokio::test]
async fn configmap_data_symlink_swap_reloads_and_dotfiles_are_ignored() {
    let t = TempDir::new("configmap");
    let dir = t.path().join("config");
    write(&dir.join("..v1/a.yaml"), V1);
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/a.yaml", dir.join("a.yaml")).unwrap();
    let s = settings(&dir, &[("RUNTIME_WATCH_ROOT", "false")]);
    let r = start(&s).await;
    assert!(!rlconfig(&r).await.contains("shop.c:"));

    // A dotfile that does not parse is never loaded: no error is counted for it.
    write(&dir.join(".editor-swap.yaml"), BAD);

    write(&dir.join("..v2/a.yaml"), V2);
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    wait_rlconfig(&r, "..data swap", |b| b.contains("shop.c:")).await;
    let m = metrics(&r).await;
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_error_total"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(limit(&call(&r, "shop", "b", "x").await), Some(7));
    r.shutdown().await;
}

/// `RUNTIME_WATCH_ROOT=true`: a deploy points the runtime root symlink at a new tree.
#[tokio::test]
async fn runtime_root_symlink_swap_reloads() {
    let t = TempDir::new("root");
    write(&t.path().join("v1/ratelimit/config/a.yaml"), V1);
    write(&t.path().join("v2/ratelimit/config/a.yaml"), V2);
    let root = t.path().join("current");
    std::os::unix::fs::symlink(t.path().join("v1"), &root).unwrap();
    let root_s = root.display().to_string();
    let mut s = settings(
        Path::new("/unused"),
        &[
            ("RUNTIME_ROOT", &root_s),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "true"),
        ],
    );
    s.config_path = root.join("ratelimit/config");
    assert!(s.watch_root);
    let r = start(&s).await;
    let tmp = t.path().join("current.tmp");
    std::os::unix::fs::symlink(t.path().join("v2"), &tmp).unwrap();
    std::fs::rename(&tmp, &root).unwrap();
    wait_rlconfig(&r, "root swap", |b| b.contains("shop.c:")).await;
    r.shutdown().await;
}

/// `MERGE_DOMAIN_CONFIG=true`: two files of one domain are merged on reload too.
/// The config location is fingerprinted before the first config is read, so a change made
/// while the server starts (after the read, before the poller runs) is still reloaded.
#[tokio::test]
async fn a_change_made_while_the_server_starts_is_reloaded() {
    let t = TempDir::new("starting");
    let file = t.path().join("config/limits.yaml");
    write(&file, V1);
    let s = settings(&t.path().join("config"), &[]);
    let first = server::first_config(&s).expect("initial config loads");
    write(&file, V2);
    let (clock, _manual) = Clock::manual(T0);
    let r = server::start(&s, first, clock)
        .await
        .expect("server starts");
    wait_rlconfig(&r, "the change made while starting", |b| {
        b.contains("shop.c:")
    })
    .await;
    r.shutdown().await;
}

#[tokio::test]
async fn reload_honours_merge_domain_config() {
    let t = TempDir::new("merge");
    let dir = t.path().join("config");
    write(&dir.join("a.yaml"), V1);
    let s = settings(&dir, &[("MERGE_DOMAIN_CONFIG", "true")]);
    let r = start(&s).await;
    write(
        &dir.join("b.yaml"),
        "domain: shop\ndescriptors:\n  - key: z\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    );
    let body = wait_rlconfig(&r, "merged file", |b| b.contains("shop.z:")).await;
    assert!(body.contains("shop.a:"), "{body}");
    r.shutdown().await;
}

/// Polling off (`TURNSTILE_RELOAD_INTERVAL_MS=0`): only an explicit reload (SIGHUP) loads.
#[tokio::test]
async fn explicit_reload_with_polling_off() {
    let t = TempDir::new("explicit");
    let dir = t.path().join("config");
    write(&dir.join("a.yaml"), V1);
    let s = settings(&dir, &[("TURNSTILE_RELOAD_INTERVAL_MS", "0")]);
    assert!(s.reload_interval.is_zero());
    let r = start(&s).await;
    // A change is not loaded by itself: V2's limit `c` stays unknown until the reload, one and
    // a half of the default poll's intervals (1 s) later.
    write(&dir.join("a.yaml"), V2);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !rlconfig(&r).await.contains("shop.c:"),
        "loaded without a reload"
    );
    let m = metrics(&r).await;
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_success_total"),
        Some(1.0)
    );
    write(&dir.join("a.yaml"), BAD);
    let e = r.reload_config().expect_err("bad config refused");
    assert!(e.to_string().contains("fortnight"), "{e}");
    write(&dir.join("a.yaml"), V2);
    r.reload_config().expect("good config loads");
    assert!(rlconfig(&r).await.contains("shop.c:"));
    let m = metrics(&r).await;
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_error_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "ratelimit_service_config_load_success_total"),
        Some(2.0)
    );
    r.shutdown().await;
}

/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true` with files: NOT_SERVING while the live config
/// has no domain, SERVING once one is loaded, NOT_SERVING again after a reload that leaves
/// none (envoyproxy/ratelimit `test/service/ratelimit_test.go`,
/// `TestServiceHealthStatusAtLeastOneConfigLoaded`, line 622). Unset, health is SERVING with
/// no domain at all.
#[tokio::test]
async fn health_waits_for_a_config_with_a_domain_when_asked() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let t = TempDir::new("health-domains");
    let dir = t.path().join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let env = [
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("TURNSTILE_RELOAD_INTERVAL_MS", "0"),
    ];
    let r = start(&settings(&dir, &env)).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", r.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let h = HealthClient::new(ch);
    let mut status = || {
        let mut h = h.clone();
        async move {
            let req = HealthCheckRequest {
                service: "ratelimit".into(),
            };
            h.check(req).await.unwrap().into_inner().status
        }
    };
    // 1 = SERVING, 2 = NOT_SERVING; a reload's health change lands on the side thread.
    assert_eq!(status().await, 2, "no domain loaded at start");
    write(&dir.join("a.yaml"), V1);
    r.reload_config().expect("loads");
    assert_eq!(settles(&mut status, 1, DEADLINE).await, 1, "health never 1");
    std::fs::remove_file(dir.join("a.yaml")).unwrap();
    r.reload_config().expect("an empty directory loads");
    assert_eq!(settles(&mut status, 2, DEADLINE).await, 2, "health never 2");
    write(&dir.join("a.yaml"), V1);
    r.reload_config().expect("loads");
    assert_eq!(settles(&mut status, 1, DEADLINE).await, 1, "health never 1");
    r.shutdown().await;

    std::fs::create_dir_all(t.path().join("empty")).unwrap();
    let plain = start(&settings(&t.path().join("empty"), &[])).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", plain.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let req = HealthCheckRequest {
        service: "ratelimit".into(),
    };
    let st = HealthClient::new(ch)
        .check(req)
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(st, 1, "unset: SERVING without a domain");
    plain.shutdown().await;
}

/// Where a test reaches the server's ports.
struct Reach {
    grpc: SocketAddr,
    http: SocketAddr,
    debug: SocketAddr,
}

/// Istio's samples/ratelimit/rate-limit-service.yaml: `/bin/ratelimit`, its environment, its
/// ConfigMap mounted at /data/ratelimit/config (here under a temp dir), ports made loopback
/// and OS-chosen so tests can run side by side.
#[test]
fn istio_sample_as_ratelimit_reloads_on_configmap_swap_and_sighup() {
    let t = TempDir::new("istio");
    let config_dir = t.path().join("data/ratelimit/config");
    configmap(&config_dir, binary::V1);
    let exe = t.path().join("bin/ratelimit");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(BIN, &exe).unwrap();
    let root = t.path().join("data").display().to_string();
    let server = Server::start(
        &exe,
        &[],
        &[
            ("LOG_LEVEL", "debug"),
            ("USE_STATSD", "false"),
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("HOST", "::"),
            ("GRPC_HOST", "::"),
        ],
    );
    // `::` listens on IPv4 too: reach both ports over 127.0.0.1.
    let v4 = |a: SocketAddr| {
        assert!(a.ip().is_unspecified() && a.is_ipv6(), "{a}");
        SocketAddr::from(([127, 0, 0, 1], a.port()))
    };
    let p = Reach {
        grpc: v4(server.ports.grpc_addr()),
        http: v4(server.ports.http),
        debug: server.ports.debug.expect("a debug port"),
    };
    let rl = http_get(p.debug, "/rlconfig");
    assert!(
        rl.contains("productpage-ratelimit.PATH_/productpage: unit=MINUTE requests_per_unit=1"),
        "{rl}"
    );
    assert_eq!(http_get(p.http, "/healthcheck"), "OK");
    let resp = block_on(binary::call(
        p.grpc,
        request("productpage-ratelimit", "PATH", "/productpage"),
        &[],
    ));
    assert_eq!(resp.overall_code, 1);

    // kubelet's ConfigMap update.
    configmap_update(
        &config_dir,
        "..v2",
        &binary::V1.replace("requests_per_unit: 1\n", "requests_per_unit: 7\n"),
    );
    wait_for("ConfigMap reload", || {
        let rl = http_get(p.debug, "/rlconfig");
        (!rl.contains("PATH_/productpage: unit=MINUTE requests_per_unit=7")).then_some(rl)
    });

    // SIGHUP reloads too, changed or not: the load counter goes up.
    let before = http_get(p.debug, "/metrics");
    let loads = |m: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix("ratelimit_service_config_load_success_total "))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let n = loads(&before);
    server.signal("HUP");
    wait_for("SIGHUP reload", || {
        let m = http_get(p.debug, "/metrics");
        (loads(&m) <= n).then_some(m)
    });
    let stderr = server.stop();
    assert!(stderr.contains("config reloaded"), "{stderr}");
}
