//! The binary as the docs describe it, run to its end or served: `serve` with one worker,
//! `run` to exit with its output, HTTP calls without a client library, the tools the docs name
//! (grpcurl, Envoy) found on PATH, and a config directory.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::binary;
pub use crate::common::binary::Server;

pub use crate::common::binary::BIN;
/// How long anything may take before a test gives up (not a timing assertion).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The repository's root, where the docs and examples are.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One worker unless `env` says otherwise, then `env`.
fn one_worker<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut one = vec![("TURNSTILE_WORKERS", "1")];
    one.extend_from_slice(env);
    one
}

/// The binary serving, as `run` runs it: one worker unless `env` says otherwise.
pub fn serve(args: &[&str], env: &[(&str, &str)]) -> Server {
    Server::start(Path::new(BIN), args, &one_worker(env))
}

/// What a run of the binary that ended said.
pub struct Ended {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary to its end (a refusal, `check`), killed at the deadline.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Ended {
    let mut child = binary::command(Path::new(BIN), args, &one_worker(env))
        .spawn()
        .expect("spawn turnstile");
    let end = Instant::now() + DEADLINE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    Ended {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Polls `f` until it says done (`None`), or panics with its last word at the deadline.
pub fn wait_for(what: &str, mut f: impl FnMut() -> Option<String>) {
    let end = Instant::now() + DEADLINE;
    let mut last = String::new();
    while Instant::now() < end {
        match f() {
            None => return,
            Some(l) => last = l,
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("{what}: never happened; last:\n{last}");
}

/// A plain HTTP/1.1 GET on a new connection: the status code and body, or the error.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    http(addr, "GET", path, "")
}

/// An HTTP/1.1 request on a new connection, `body` sent as JSON.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

/// A program the tests drive, from PATH or the places scripts/install-test-deps.sh puts it;
/// installed with that script when missing.
pub fn tool(name: &str) -> PathBuf {
    let find = || {
        let home = std::env::var("HOME").unwrap_or_default();
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([PathBuf::from(home).join(".local/bin")])
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    };
    if let Some(p) = find() {
        return p;
    }
    let st = Command::new("bash")
        .arg(repo().join("scripts/install-test-deps.sh"))
        .status()
        .expect("run scripts/install-test-deps.sh");
    assert!(st.success(), "scripts/install-test-deps.sh failed");
    find().unwrap_or_else(|| panic!("{name} not found after scripts/install-test-deps.sh"))
}

/// A config directory holding `yaml` as `config.yaml`.
pub fn config_dir(dir: &Path, yaml: &str) -> PathBuf {
    let p = dir.join("config");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("config.yaml"), yaml).unwrap();
    p
}

pub const SIMPLE: &str = "domain: d
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 100
";
