//! The binary cargo built, run as operators run it: environment only, ports chosen by the OS
//! and read from its readiness line, stopped with a signal.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub use super::run::wait_for;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

pub const BIN: &str = env!("CARGO_BIN_EXE_turnstile");
const DEADLINE: Duration = Duration::from_secs(30);

/// Ports printed on the readiness line.
pub struct Ports {
    /// `host:port`, or `unix:PATH` for a unix socket.
    pub grpc: String,
    pub http: SocketAddr,
    /// `None` when the port is off.
    pub debug: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    /// The admin listener (`TURNSTILE_ADMIN_ADDR`), when on.
    pub admin: Option<SocketAddr>,
    /// The RESP port (`TURNSTILE_RESP_ADDR`), when on.
    pub resp: Option<SocketAddr>,
}

impl Ports {
    /// The gRPC port, served on TCP.
    pub fn grpc_addr(&self) -> SocketAddr {
        (self.grpc.parse()).unwrap_or_else(|_| panic!("gRPC on {}, not TCP", self.grpc))
    }
}

/// Every port on loopback, chosen by the OS.
pub const LOOPBACK: [(&str, &str); 7] = [
    ("HOST", "127.0.0.1"),
    ("PORT", "0"),
    ("GRPC_HOST", "127.0.0.1"),
    ("GRPC_PORT", "0"),
    ("DEBUG_HOST", "127.0.0.1"),
    ("DEBUG_PORT", "0"),
    ("PROMETHEUS_ADDR", "127.0.0.1:0"),
];

/// Loopback and OS-chosen ports, then `env` over them; nothing else from this process.
pub fn vars<'a>(env: &[(&'a str, &'a str)]) -> HashMap<&'a str, &'a str> {
    let mut vars: HashMap<&str, &str> = LOOPBACK.into_iter().collect();
    vars.extend([
        ("TURNSTILE_WORKERS", "2"),
        ("TURNSTILE_RELOAD_INTERVAL_MS", "50"),
    ]);
    vars.extend(env.iter().copied());
    vars
}

pub struct Server {
    child: Child,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
    pub ports: Ports,
    /// The first line on stdout, which tells the ports.
    pub ready: String,
}

/// `program` with `args`, only `vars(env)` in its environment, no stdin, its output piped.
pub fn command(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(vars(env))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The binary spawned, its readiness line not read yet: a start that waits (for Redis, for its
/// durable counters) can be looked at and stopped meanwhile.
pub struct Starting {
    /// Taken when it becomes a [`Server`]; killed on drop until then.
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
    stdout: mpsc::Receiver<String>,
}

impl Starting {
    /// Runs `program` with only `env` (plus loopback, OS-chosen ports unless given).
    pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Starting {
        let mut child = command(program, args, env)
            .spawn()
            .expect("spawn turnstile");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().unwrap();
        let stderr_reader = thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Starting {
            child: Some(child),
            stderr,
            stderr_reader: Some(stderr_reader),
            stdout: rx,
        }
    }

    /// Waits until its stderr holds `what` (panics past the deadline).
    pub fn logged(&self, what: &str) {
        let end = Instant::now() + DEADLINE;
        while !self.stderr.lock().unwrap().contains(what) {
            assert!(
                Instant::now() < end,
                "no {what:?} in stderr:\n{}",
                self.stderr.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Its exit status and whole stderr once it has exited, or `None` if it still runs after
    /// `within` (it is killed when dropped).
    pub fn exit_within(&mut self, within: Duration) -> Option<(std::process::ExitStatus, String)> {
        let end = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                if let Some(h) = self.stderr_reader.take() {
                    let _ = h.join();
                }
                let stderr = self.stderr.lock().unwrap().clone();
                return Some((st, stderr));
            }
            if Instant::now() >= end {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the readiness line: the server, serving.
    pub fn ready(mut self) -> Server {
        let line = self.stdout.recv_timeout(DEADLINE).unwrap_or_else(|_| {
            panic!(
                "no readiness line; stderr:\n{}",
                self.stderr.lock().unwrap()
            )
        });
        // `turnstile: listening grpc=.. http=..`, or with LOG_FORMAT=json a JSON event whose
        // fields carry the addresses.
        let json: Option<serde_json::Value> = serde_json::from_str(&line).ok();
        let field = |name: &str| match &json {
            Some(v) => v["fields"][name].as_str().map(str::to_owned),
            None => line
                .split_whitespace()
                .find_map(|p| p.strip_prefix(&format!("{name}=")))
                .map(str::to_owned),
        };
        let addr = |name: &str| field(name).and_then(|a| a.parse().ok());
        let ports = Ports {
            grpc: field("grpc").unwrap_or_else(|| panic!("no grpc address in {line:?}")),
            http: addr("http").unwrap_or_else(|| panic!("no http address in {line:?}")),
            debug: addr("debug"),
            metrics: addr("metrics"),
            admin: addr("admin"),
            resp: addr("resp"),
        };
        Server {
            child: self.child.take().expect("running"),
            stderr: self.stderr.clone(),
            stderr_reader: self.stderr_reader.take(),
            ports,
            ready: line,
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Server {
    /// Runs `program` with only `env` (plus loopback, OS-chosen ports unless given), and waits
    /// for its readiness line.
    pub fn start(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Starting::spawn(program, args, env).ready()
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether it has exited, without waiting.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// SIGTERM, exit 0, and the whole of stderr.
    pub fn stop(mut self) -> String {
        self.signal("TERM");
        let end = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < end, "did not exit after SIGTERM");
            thread::sleep(Duration::from_millis(20));
        };
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        let stderr = self.stderr.lock().unwrap().clone();
        assert!(status.success(), "exit {status}; stderr:\n{stderr}");
        stderr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    /// SIGKILL, as an OOM kill or a lost node ends a process: nothing runs after it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with only `env` (and `args`) to its end, expecting it to fail at start:
/// its stderr. A process that starts instead (its readiness line on stdout) is killed and the
/// test fails, rather than waiting for a server that never ends.
pub fn start_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = Command::new(BIN)
        .args(args)
        .env_clear()
        .envs([
            ("PORT", "0"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("GRPC_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run turnstile");
    let mut err = child.stderr.take().unwrap();
    let stderr = thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    thread::spawn(move || {
        let first = BufReader::new(out).lines().map_while(Result::ok).next();
        let _ = tx.send(first);
    });
    // The first line on stdout, or none when stdout closes (the process ended).
    let started = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("neither failed nor started within {DEADLINE:?}")
    });
    if let Some(line) = started {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "started: {line}\nstderr:\n{}",
            stderr.join().unwrap_or_default()
        );
    }
    let status = child.wait().expect("wait for turnstile");
    assert!(!status.success(), "exited 0 without starting");
    stderr.join().unwrap_or_default()
}

pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("http://{addr}{path}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

pub fn request(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    crate::common::one(domain, &[(key, value)])
}

/// A call with `metadata` as gRPC metadata (what Envoy sends: x-request-id, trace headers).
pub async fn call(
    grpc: SocketAddr,
    req: RateLimitRequest,
    metadata: &[(&'static str, &str)],
) -> RateLimitResponse {
    let mut c = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut r = tonic::Request::new(req);
    for (k, v) in metadata {
        r.metadata_mut().insert(*k, v.parse().unwrap());
    }
    c.should_rate_limit(r)
        .await
        .expect("call succeeds")
        .into_inner()
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Istio's sample config (its ConfigMap's `config.yaml`): productpage limited per path.
pub const V1: &str = "domain: productpage-ratelimit
descriptors:
  - key: PATH
    value: \"/productpage\"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// A ConfigMap volume at `dir`: `..v1/config.yaml`, `..data -> ..v1`, `config.yaml -> ..data/...`.
pub fn configmap(dir: &Path, yaml: &str) {
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/config.yaml"), yaml).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
}

pub fn configmap_update(dir: &Path, version: &str, yaml: &str) {
    std::fs::create_dir_all(dir.join(version)).unwrap();
    std::fs::write(dir.join(version).join("config.yaml"), yaml).unwrap();
    std::os::unix::fs::symlink(version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
}
