//! The `turnstile` binary as operators run it: `check`, `serve` configured from
//! envoyproxy/ratelimit's environment, SIGTERM, and being started as `ratelimit`.
//!
//! Every process gets a cleared environment plus the variables a test sets, ports chosen by
//! the OS (port 0, read back from the `turnstile: listening ...` line), and its own temp dir.

use crate::common::tempdir::TempDir;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");
/// How long anything may take: starting, answering, stopping.
const DEADLINE: Duration = Duration::from_secs(30);
const READY_PREFIX: &str = "turnstile: listening ";

const VALID: &str = "domain: cli
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: path
    value: /login
    rate_limit:
      unit: minute
      requests_per_unit: 5
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: internal
    value: \"true\"
";

/// The limits in VALID, as `check` and `/rlconfig` name them.
const VALID_KEYS: [&str; 3] = [
    "cli.remote_address:",
    "cli.path_/login:",
    "cli.path_/login.user:",
];

const INVALID: &str = "domain: cli
descriptors:
  - key: remote_address
    rate_limit:
      unit: fortnite
      requests_per_unit: 10
";

// ------------------------------------------------------------------------------------------
// `turnstile check`

fn check(config: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(config)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run turnstile check")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_valid_file_prints_every_limit_and_exits_0() {
    let t = TempDir::new("check-ok");
    let f = t.write("limits.yaml", VALID);
    let out = check(&f, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        VALID_KEYS.len(),
        "one line per limit:\n{stdout}"
    );
    for key in VALID_KEYS {
        assert_eq!(
            lines.iter().filter(|l| l.starts_with(key)).count(),
            1,
            "one line for {key}:\n{stdout}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cli.path_/login:") && l.contains("requests_per_unit=5")),
        "{stdout}"
    );
    assert!(
        !stdout.contains("internal"),
        "a whitelist has no limit:\n{stdout}"
    );
}

#[test]
fn check_valid_directory_prints_limits_of_every_file() {
    let t = TempDir::new("check-dir");
    t.write("a.yaml", VALID);
    t.write(
        "b.yml",
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 3}\n",
    );
    t.write(".skipped.yaml", "this is: [not valid");
    let out = check(t.path(), &[]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), VALID_KEYS.len() + 1, "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("other.k:")),
        "{stdout}"
    );
}

#[test]
fn check_invalid_file_exits_2_naming_file_and_path() {
    let t = TempDir::new("check-bad");
    let f = t.write("limits.yaml", INVALID);
    let out = check(&f, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&f.display().to_string()),
        "names the file:\n{stderr}"
    );
    assert!(
        stderr.contains("descriptors[0].rate_limit.unit"),
        "names the path in the file:\n{stderr}"
    );
    assert!(stderr.contains("fortnite"), "says what is wrong:\n{stderr}");
    assert!(
        text(&out.stdout).is_empty(),
        "no limits printed for an invalid config"
    );
}

#[test]
fn check_names_a_bad_window_with_file_and_path() {
    let t = TempDir::new("check-windows");
    let cases = [
        (
            "unit: minute, unit_multiplier: 0",
            "rate_limit.unit_multiplier: unit_multiplier must be at least 1",
        ),
        (
            "unit: month, calendar: Europe/Atlantis",
            "rate_limit.calendar: unknown time zone \"Europe/Atlantis\"",
        ),
        (
            "unit: hour, calendar: UTC",
            "rate_limit.calendar: calendar applies to day, week, month and year limits, not hour",
        ),
    ];
    for (i, (limit, needle)) in cases.iter().enumerate() {
        let f = t.write(
            &format!("w{i}.yaml"),
            &format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{limit}, requests_per_unit: 1}}\n"
            ),
        );
        let out = check(&f, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
        let want = format!("{}: descriptors[0].{needle}", f.display());
        assert!(stderr.contains(&want), "{want}\nnot in:\n{stderr}");
    }
}

/// A token bucket whose `reserve` is over its burst could never admit a check (every one
/// would wait for ever): `check` refuses it naming the field, as it does the same mistake on a
/// window's `requests_per_unit`.
#[test]
fn check_refuses_a_reserve_no_check_could_fit() {
    let t = TempDir::new("check-reserve");
    let cases = [
        (
            "algorithm: token_bucket, burst: 5, reserve: 6",
            "reserve 6 is more than the token bucket's burst 5",
        ),
        ("reserve: 11", "reserve 11 is more than the limit's 10"),
    ];
    for (i, (extra, says)) in cases.iter().enumerate() {
        let f = t.write(
            &format!("r{i}.yaml"),
            &format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 10, {extra}}}\n"
            ),
        );
        let out = check(&f, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {stderr}");
        let want = format!("{}: descriptors[0].rate_limit.reserve: {says}", f.display());
        assert!(stderr.contains(&want), "{want}\nnot in:\n{stderr}");
    }
}

#[test]
fn check_unknown_key_exits_2() {
    let t = TempDir::new("check-unknown");
    let f = t.write(
        "limits.yaml",
        "domain: cli\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burstt: 3}\n",
    );
    let out = check(&f, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&f.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("unknown key") && stderr.contains("burstt"),
        "{stderr}"
    );
}

#[test]
fn check_invalid_file_in_directory_names_that_file() {
    let t = TempDir::new("check-dir-bad");
    t.write("a.yaml", VALID);
    let bad = t.write(
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
    );
    let out = check(t.path(), &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("descriptors[1]") && stderr.contains("duplicate"),
        "{stderr}"
    );
}

#[test]
fn check_honours_merge_domain_config() {
    let t = TempDir::new("check-merge");
    t.write(
        "a.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    t.write(
        "b.yaml",
        "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    );
    let out = check(t.path(), &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "duplicate domain: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("duplicate domain"),
        "{}",
        text(&out.stderr)
    );
    let out = check(t.path(), &[("MERGE_DOMAIN_CONFIG", "true")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

#[test]
fn check_missing_path_fails_with_a_clear_message() {
    let t = TempDir::new("check-missing");
    let p = t.path().join("does-not-exist.yaml");
    let out = check(&p, &[]);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a missing config must fail:\n{stderr}"
    );
    assert!(
        stderr.contains(&p.display().to_string()),
        "names the path:\n{stderr}"
    );
    assert!(
        stderr.contains("cannot read") || stderr.contains("No such file"),
        "says why:\n{stderr}"
    );
}

/// `check` with no `--config`, no `RUNTIME_*` and nothing at the default location found
/// nothing to check: it fails naming where it looked, instead of "config OK: 0 domain(s)".
#[test]
fn check_with_nothing_found_fails_naming_where_it_looked() {
    let out = Command::new(BIN)
        .arg("check")
        .env_clear()
        .output()
        .expect("run turnstile check");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("nothing to check")
            && stderr.contains("the default location /srv/runtime_data/current/config")
            && stderr.contains("--config"),
        "{stderr}"
    );
    assert!(!stderr.contains("config OK"), "{stderr}");
}

// ------------------------------------------------------------------------------------------
// `turnstile serve`

/// A running server process, killed if the test ends without stopping it.
struct Server {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
}

impl Server {
    fn spawn(mut cmd: Command) -> Server {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn turnstile");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let mut err = child.stderr.take().expect("stderr");
        let stderr_reader = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Server {
            child,
            stdout: rx,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads stdout until the readiness line; returns (grpc, http).
    fn wait_listening(&mut self) -> (SocketAddr, SocketAddr) {
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(READY_PREFIX) {
                        return parse_listening(rest)
                            .unwrap_or_else(|| panic!("bad readiness line: {line:?}"));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "no readiness line within {DEADLINE:?}; stderr:\n{}",
                        self.stderr()
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.exit_within(DEADLINE);
                    panic!(
                        "exited ({status}) before printing the readiness line; stderr:\n{}",
                        self.stderr()
                    )
                }
            }
        }
    }

    fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -TERM {pid} failed");
    }

    /// Polls until the process exits; panics (and kills it) after `d`.
    fn exit_within(&mut self, d: Duration) -> ExitStatus {
        let end = Instant::now() + d;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "process did not exit within {d:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for exit and for stderr to be drained (the reader ends at EOF).
    fn exit_and_stderr(&mut self) -> (ExitStatus, String) {
        let st = self.exit_within(DEADLINE);
        // The process is gone, so its stderr is at EOF and the reader ends.
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        (st, self.stderr())
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

fn parse_listening(rest: &str) -> Option<(SocketAddr, SocketAddr)> {
    let mut grpc = None;
    let mut http = None;
    for part in rest.split_whitespace() {
        if let Some(a) = part.strip_prefix("grpc=") {
            grpc = a.parse().ok();
        } else if let Some(a) = part.strip_prefix("http=") {
            http = a.parse().ok();
        }
    }
    Some((grpc?, http?))
}

/// A raw HTTP/1.1 GET; returns the status code and the body.
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect to HTTP port");
    s.set_read_timeout(Some(DEADLINE)).expect("read timeout");
    s.set_write_timeout(Some(DEADLINE)).expect("write timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read response");
    let status_line = resp.lines().next().unwrap_or_default().to_owned();
    let code = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP response: {resp:?}"));
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// `RUNTIME_*` pointing at `<tmp>/root/sub/app`, holding `a.yaml`; loopback, OS-chosen ports.
fn runtime_env(t: &TempDir, yaml: &str) -> Vec<(String, String)> {
    t.write("root/sub/app/a.yaml", yaml);
    let root = t.path().join("root").display().to_string();
    [
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "sub"),
        ("RUNTIME_APPDIRECTORY", "app"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        // Keep off the fixed debug and Prometheus ports (6070, 9090).
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Starts a server from `program` with `args` and `env`, checks it serves what VALID defines,
/// then stops it with SIGTERM and expects exit status 0.
fn serve_and_stop(program: &Path, args: &[&str], env: Vec<(String, String)>) {
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(env);
    let mut server = Server::spawn(cmd);
    let (grpc, http) = server.wait_listening();
    for a in [grpc, http] {
        assert_eq!(a.ip().to_string(), "127.0.0.1", "GRPC_HOST/HOST honoured");
        assert_ne!(a.port(), 0, "the OS-chosen port is reported");
    }
    assert_ne!(grpc, http);

    let (code, body) = http_get(http, "/healthcheck");
    assert_eq!(code, 200, "healthcheck body: {body}");
    TcpStream::connect_timeout(&grpc, DEADLINE).expect("gRPC port accepts connections");

    // The config came from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
    let (code, body) = http_get(http, "/rlconfig");
    assert_eq!(code, 200, "{body}");
    for key in VALID_KEYS {
        assert!(body.contains(key), "/rlconfig lacks {key}:\n{body}");
    }

    server.sigterm();
    let st = server.exit_within(DEADLINE);
    assert!(
        st.success(),
        "exit after SIGTERM: {st}; stderr:\n{}",
        server.stderr()
    );
}

#[test]
fn serve_from_runtime_env_is_healthy_and_stops_on_sigterm() {
    let t = TempDir::new("serve");
    serve_and_stop(Path::new(BIN), &["serve"], runtime_env(&t, VALID));
}

#[test]
fn serve_with_config_flag_overrides_runtime_env() {
    let t = TempDir::new("serve-flag");
    let mut env = runtime_env(&t, INVALID);
    // The runtime directory holds an invalid config; --config points elsewhere.
    let f = t.write("elsewhere/limits.yaml", VALID);
    env.retain(|(k, _)| k != "RUNTIME_SUBDIRECTORY");
    let f = f.display().to_string();
    serve_and_stop(Path::new(BIN), &["serve", "--config", &f], env);
}

#[test]
fn serve_with_invalid_config_exits_2_naming_the_file() {
    let t = TempDir::new("serve-bad");
    let env = runtime_env(&t, INVALID);
    let file = t.path().join("root/sub/app/a.yaml").display().to_string();
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").env_clear().envs(env);
    let mut server = Server::spawn(cmd);
    let (st, stderr) = server.exit_and_stderr();
    assert_eq!(st.code(), Some(2), "stderr:\n{stderr}");
    assert!(stderr.contains(&file), "names the file:\n{stderr}");
    assert!(
        stderr.contains("descriptors[0].rate_limit.unit"),
        "{stderr}"
    );
}

#[test]
fn serve_with_invalid_config_flag_exits_2_naming_the_file() {
    let t = TempDir::new("serve-bad-flag");
    let f = t.write("bad.yaml", INVALID);
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"]).arg(&f).env_clear().envs([
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
    ]);
    let mut server = Server::spawn(cmd);
    let (st, stderr) = server.exit_and_stderr();
    assert_eq!(st.code(), Some(2), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&f.display().to_string()),
        "names the file:\n{stderr}"
    );
}

#[test]
fn invoked_as_ratelimit_serves_from_environment() {
    let t = TempDir::new("ratelimit");
    let bin_dir = t.path().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin dir");
    let exe = bin_dir.join("ratelimit");
    std::os::unix::fs::symlink(BIN, &exe).expect("symlink ratelimit");
    serve_and_stop(&exe, &[], runtime_env(&t, VALID));
}

#[test]
fn check_names_the_limits_rlqs_cannot_enforce() {
    let t = TempDir::new("check-rlqs");
    let f = t.write(
        "limits.yaml",
        "domain: q
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
",
    );
    let out = check(&f, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "valid for ShouldRateLimit: {stderr}"
    );
    let rlqs: Vec<&str> = stderr.lines().filter(|l| l.starts_with("RLQS: ")).collect();
    assert_eq!(rlqs.len(), 1, "{stderr}");
    assert!(
        rlqs[0].contains("q.user") && rlqs[0].contains("sliding_window"),
        "{stderr}"
    );
}

/// `ratelimit --help` (manifests and people reach for the reference's name) prints the help of
/// `serve` and exits 0; it starts nothing.
#[test]
fn invoked_as_ratelimit_help_prints_help_and_starts_nothing() {
    let t = TempDir::new("ratelimit-help");
    let exe = t.path().join("ratelimit");
    std::os::unix::fs::symlink(BIN, &exe).expect("symlink ratelimit");
    let mut child = crate::common::binary::command(&exe, &["--help"], &[])
        .spawn()
        .expect("spawn ratelimit");
    let status = crate::common::envoy::wait_with_deadline(&mut child, DEADLINE);
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("its output");
    let stdout = text(&out.stdout);
    assert!(
        status.is_some_and(|s| s.success()),
        "still running or failed ({status:?}); stdout:\n{stdout}"
    );
    assert!(stdout.contains("Usage: ratelimit"), "{stdout}");
    assert!(stdout.contains("--config"), "{stdout}");
    assert!(!stdout.contains("listening"), "{stdout}");
}

/// `--config` names a file while `CONFIG_TYPE=GRPC_XDS_SOTW` says the limits come over xDS:
/// the start is refused naming both, rather than one silently winning. `check` reads the file
/// whatever `CONFIG_TYPE` says.
#[test]
fn config_flag_with_xds_config_type_is_refused_naming_both() {
    let t = TempDir::new("config-and-xds");
    let f = t.write("limits.yaml", VALID);
    let f = f.to_str().unwrap();
    let err = crate::common::binary::start_fails(
        &["serve", "--config", f],
        &[("CONFIG_TYPE", "GRPC_XDS_SOTW")],
    );
    assert!(
        err.contains(&format!("--config {f}")) && err.contains("CONFIG_TYPE=GRPC_XDS_SOTW"),
        "{err}"
    );
    let out = check(Path::new(f), &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `check` and `/rlconfig` list every setting a limit's line can carry, `local_first` and
/// `value_to_metric` among them.
#[tokio::test]
async fn check_and_rlconfig_lines_carry_local_first_and_value_to_metric() {
    let yaml = "domain: lf
descriptors:
  - key: api_key
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5, local_first: true}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5, local_first: false}
";
    let want = [
        "lf.api_key: unit=MINUTE requests_per_unit=5 algorithm=fixed_window local_first=true value_to_metric",
        "lf.path: unit=MINUTE requests_per_unit=5 algorithm=fixed_window local_first=false",
    ];
    let t = TempDir::new("check-lf");
    let f = t.write("limits.yaml", yaml);
    let out = check(&f, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = crate::common::TestServer::start(yaml).await;
    let rlconfig = reqwest::get(format!("{}/rlconfig", s.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in want {
        assert!(
            stdout.lines().any(|l| l == line),
            "check lacks {line:?}:\n{stdout}"
        );
        assert!(
            rlconfig.lines().any(|l| l == line),
            "/rlconfig lacks {line:?}:\n{rlconfig}"
        );
    }
}

/// `serve` with neither `--config` nor `RUNTIME_*` serves no limits: it says so at warn level,
/// naming the location it looked at, and still serves (a GoCC-only or xDS deployment has no
/// YAML, and those name their source).
#[test]
fn serve_with_no_config_found_warns_naming_where_it_looked() {
    let mut cmd = Command::new(BIN);
    let ports = [
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    cmd.arg("serve").env_clear().envs(ports);
    let mut server = Server::spawn(cmd);
    let (_, http) = server.wait_listening();
    let (code, body) = http_get(http, "/healthcheck");
    assert_eq!(code, 200, "{body}");
    server.sigterm();
    let (st, stderr) = server.exit_and_stderr();
    assert!(st.success(), "{st}: {stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.contains("no config found"))
        .unwrap_or_else(|| panic!("no warning:\n{stderr}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("/srv/runtime_data/current/config") && warning.contains("NO limits"),
        "{warning}"
    );
}
