//! Every door against every promise the docs make of all of them, through the binary: a table
//! of door × promise. A row is a way in ([`Door`]: how a call goes through it, which server
//! serves it, the `door` label it counts under); a test is a promise, walked over every row,
//! each failure naming the door. The next door is checked by adding a row.
//!
//! The promises (docs/architecture.md, "Every door"): what a caller sends is bounded, with one
//! error naming the bound; no client value in clear on a listener bound beyond loopback; every
//! call in the request series under its door's label, and in a span; SIGHUP reads every file a
//! door follows, with polling off; while the start waits for Redis, every call is answered
//! naming the wait; the debug port shows the limits served and the file they came from; an
//! HTTP request whose headers never end is closed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::common::binary::{block_on, Server, Starting, BIN};
use crate::common::redis::free_port;
use crate::common::run::{http, wait_for};
use crate::common::tempdir::TempDir;
use crate::limitador::{call, limitador_server, request, CHECK, SHOULD_RATE_LIMIT};

/// Envoy's door's limits (and `/rate`'s, `THROTTLE`'s: those carry their own).
const YAML: &str = "domain: doors\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n";
/// Limitador's door's limits.
const LIMITS: &str = "- namespace: doors\n  max_value: 100\n  seconds: 60\n  conditions: []\n  variables: [\"descriptors[0].user\"]\n";

/// A value over every door's bound on what a caller sends (4 096 bytes a value, 1 024 a key).
fn oversized() -> String {
    "v".repeat(5000)
}

/// The server a door is served by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `turnstile serve`: Envoy's door, GoCC's and ThrottleCrab's beside it.
    Serve,
    /// The binary as `limitador-server`.
    Limitador,
}

/// A way in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    EnvoyGrpc,
    EnvoyJson,
    GoccRate,
    ThrottleResp,
    ThrottleHttp,
    LimitadorGrpc,
    KuadrantGrpc,
    LimitadorHttp,
}

const DOORS: [Door; 8] = [
    Door::EnvoyGrpc,
    Door::EnvoyJson,
    Door::GoccRate,
    Door::ThrottleResp,
    Door::ThrottleHttp,
    Door::LimitadorGrpc,
    Door::KuadrantGrpc,
    Door::LimitadorHttp,
];

/// What a call got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// A decision (admitted or limited).
    Decided,
    /// No decision: the code and the message, as the protocol says them.
    Refused(String),
}

impl Answer {
    fn refusal(&self, door: Door) -> &str {
        match self {
            Answer::Refused(m) => m,
            Answer::Decided => panic!("{door:?}: decided, where a refusal was due"),
        }
    }
}

impl Door {
    fn mode(self) -> Mode {
        match self {
            Door::LimitadorGrpc | Door::KuadrantGrpc | Door::LimitadorHttp => Mode::Limitador,
            _ => Mode::Serve,
        }
    }

    /// The `door` label of the request series.
    fn label(self) -> &'static str {
        match self {
            Door::EnvoyGrpc | Door::EnvoyJson => "envoy",
            Door::GoccRate => "gocc",
            Door::ThrottleResp | Door::ThrottleHttp => "throttle",
            _ => "limitador",
        }
    }

    /// Is it served on the HTTP port?
    fn http(self) -> bool {
        matches!(
            self,
            Door::EnvoyJson | Door::GoccRate | Door::ThrottleHttp | Door::LimitadorHttp
        )
    }

    /// One call through the door for the user `value`, on `at`'s ports.
    fn call(self, at: &Reach, value: &str) -> Answer {
        let grpc = |method: &'static str| {
            let req: RateLimitRequest = request("doors", &[&[("user", value)]], 1);
            let url = format!("http://{}", at.grpc);
            match block_on(call::<_, RateLimitResponse>(&url, method, req)) {
                Ok(_) => Answer::Decided,
                Err(s) => Answer::Refused(format!("{:?}: {}", s.code(), s.message())),
            }
        };
        let post = |path: &str, body: String| match http(at.http, "POST", path, &body) {
            Ok((200 | 429, _)) => Answer::Decided,
            Ok((code, body)) => Answer::Refused(format!("{code}: {body}")),
            Err(e) => panic!("{self:?}: {e}"),
        };
        match self {
            Door::EnvoyGrpc | Door::LimitadorGrpc => grpc(SHOULD_RATE_LIMIT),
            Door::KuadrantGrpc => grpc(CHECK),
            Door::EnvoyJson => post(
                "/json",
                serde_json::json!({"domain": "doors", "descriptors": [{"entries": [{"key": "user", "value": value}]}]}).to_string(),
            ),
            Door::ThrottleHttp => post(
                "/throttle",
                serde_json::json!({"key": value, "max_burst": 10, "count_per_period": 100, "period": 60}).to_string(),
            ),
            Door::LimitadorHttp => post(
                "/check_and_report",
                serde_json::json!({"namespace": "doors", "values": {"user": value}, "delta": 1}).to_string(),
            ),
            Door::GoccRate => match http(at.http, "POST", &format!("/rate/{value}"), "") {
                Ok((200 | 429, _)) => Answer::Decided,
                Ok((code, body)) => Answer::Refused(format!("{code}: {body}")),
                Err(e) => panic!("{self:?}: {e}"),
            },
            Door::ThrottleResp => {
                let resp = at.resp.expect("the RESP port");
                let reply = resp_call(resp, &["THROTTLE", value, "10", "100", "60"]);
                match reply.as_bytes().first() {
                    Some(b'*') => Answer::Decided,
                    _ => Answer::Refused(reply),
                }
            }
        }
    }
}

/// One RESP command on a new connection; its reply's first line.
fn resp_call(at: SocketAddr, args: &[&str]) -> String {
    let mut s = TcpStream::connect(at).expect("RESP connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(cmd.as_bytes()).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().unwrap_or("").to_owned()
}

/// A `POST` declaring a 2 MiB body, of which it sends a little: the whole answer.
fn oversized_body(at: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(at).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{{\"pad\": \"",
        2 << 20
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// Where a server's ports are reached from here (over 127.0.0.1, however they are bound).
#[derive(Debug, Clone, Copy)]
struct Reach {
    grpc: SocketAddr,
    http: SocketAddr,
    debug: SocketAddr,
    resp: Option<SocketAddr>,
}

fn loopback(a: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], a.port()))
}

/// A server of `mode`, its limits in a file of its own.
struct Served {
    server: Server,
    reach: Reach,
    /// The file its door reads its limits from.
    file: PathBuf,
    _dir: TempDir,
}

/// The command line and environment that start `mode` on `file`: every port on `host`.
fn command(mode: Mode, dir: &TempDir, host: &str) -> (PathBuf, Vec<String>, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = [
        ("DEBUG_HOST", host),
        ("DEBUG_PORT", "0"),
        ("TURNSTILE_SHOW_CLIENT_VALUES", "false"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    match mode {
        Mode::Serve => {
            let file = dir.write("limits.yaml", YAML);
            env.extend(
                [
                    ("HOST", host.to_owned()),
                    ("GRPC_HOST", host.to_owned()),
                    ("TURNSTILE_RESP_ADDR", format!("{host}:0")),
                    ("TURNSTILE_RESP_ALLOW_REMOTE", "true".to_owned()),
                ]
                .map(|(k, v)| (k.to_owned(), v)),
            );
            let args = vec![
                "serve".into(),
                "--config".into(),
                file.display().to_string(),
            ];
            (PathBuf::from(BIN), args, env)
        }
        Mode::Limitador => {
            let file = dir.write("limits.yaml", LIMITS);
            env.extend(
                [("ENVOY_RLS_HOST", host), ("HTTP_API_HOST", host)]
                    .map(|(k, v)| (k.to_owned(), v.to_owned())),
            );
            let args = ["--http-port", "0", "--rls-port", "0"]
                .map(String::from)
                .into_iter()
                .chain([file.display().to_string(), "memory".into()])
                .collect();
            (limitador_server(dir.path()), args, env)
        }
    }
}

/// `mode` served with every port on `host`, `env` over its settings.
fn serve(mode: Mode, host: &str, env: &[(&str, &str)]) -> Served {
    let dir = TempDir::new("doors");
    let (program, args, mut vars) = command(mode, &dir, host);
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Server::start(&program, &args, &vars);
    let p = &server.ports;
    let reach = Reach {
        grpc: loopback(p.grpc_addr()),
        http: loopback(p.http),
        debug: loopback(p.debug.expect("the debug port")),
        resp: p.resp.map(loopback),
    };
    let file = dir.path().join("limits.yaml");
    Served {
        server,
        reach,
        file,
        _dir: dir,
    }
}

fn get(at: SocketAddr, path: &str) -> String {
    match http(at, "GET", path, "") {
        Ok((_, body)) => body,
        Err(e) => panic!("GET {path}: {e}"),
    }
}

/// A series' value in Prometheus text.
fn series(text: &str, name: &str) -> f64 {
    (text.lines())
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Runs `promise` on every door, each server of a mode started once by `start`.
fn walk(start: impl Fn(Mode) -> Served, promise: impl Fn(Door, &Served)) {
    for mode in [Mode::Serve, Mode::Limitador] {
        let served = start(mode);
        for door in DOORS.into_iter().filter(|d| d.mode() == mode) {
            promise(door, &served);
        }
        served.server.stop();
    }
}

#[test]
fn every_door_bounds_what_a_caller_sends_and_names_the_bound() {
    walk(
        |mode| serve(mode, "127.0.0.1", &[]),
        |door, s| {
            let big = oversized();
            let answer = door.call(&s.reach, &big);
            let why = answer.refusal(door);
            assert!(
                why.contains("InvalidArgument")
                    || why.starts_with("400")
                    || why.starts_with("-ERR"),
                "{door:?}: an oversized value is the caller's error: {why}"
            );
            // The bound named: a value's 4 096 bytes, or a throttle key's 1 024.
            let named = why.contains("4096") || why.contains("1024");
            assert!(why.contains("bytes") && named, "{door:?}: {why}");
            if door.http() {
                // A body over the bound (1 MiB, as a gRPC message) is refused before it is read.
                let path = match door {
                    Door::EnvoyJson => "/json",
                    Door::ThrottleHttp => "/throttle",
                    Door::LimitadorHttp => "/check",
                    _ => "/rate/k",
                };
                let text = oversized_body(s.reach.http, path);
                assert!(text.starts_with("HTTP/1.1 413"), "{door:?}: {text}");
                assert!(text.contains("bytes"), "{door:?}: {text}");
            }
        },
    );
}

#[test]
fn every_door_counts_its_calls_errors_and_latency() {
    walk(
        |mode| serve(mode, "127.0.0.1", &[]),
        |door, s| {
            let label = door.label();
            let calls = format!("ratelimit_service_requests_total{{door=\"{label}\"}}");
            let errors = format!(
                "ratelimit_service_errors_total{{door=\"{label}\",kind=\"invalid_argument\"}}"
            );
            let latency =
                format!("ratelimit_service_request_duration_seconds_count{{door=\"{label}\"}}");
            let before = get(s.reach.debug, "/metrics");
            assert_eq!(door.call(&s.reach, "alice"), Answer::Decided, "{door:?}");
            let _ = door.call(&s.reach, &oversized());
            let after = get(s.reach.debug, "/metrics");
            for (name, more) in [(&calls, 2.0), (&errors, 1.0), (&latency, 2.0)] {
                assert_eq!(
                    series(&after, name) - series(&before, name),
                    more,
                    "{door:?}: {name}\n{after}"
                );
            }
        },
    );
}

#[test]
fn no_door_shows_a_client_value_in_clear_beyond_loopback() {
    walk(
        |mode| serve(mode, "0.0.0.0", &[]),
        |door, s| {
            let secret = format!("secret{door:?}");
            assert_eq!(door.call(&s.reach, &secret), Answer::Decided, "{door:?}");
            let pages = [
                (s.reach.http, "/metrics"),
                (s.reach.http, "/debug"),
                (s.reach.http, "/counters/doors"),
                (s.reach.http, "/rlconfig"),
                (s.reach.debug, "/metrics"),
                (s.reach.debug, "/rlconfig"),
                (s.reach.debug, "/debug/top"),
                (s.reach.debug, "/debug/status"),
            ];
            for (at, path) in pages {
                let page = get(at, path);
                assert!(
                    !page.contains(&secret),
                    "{door:?}: {path} shows {secret}:\n{page}"
                );
            }
            // Where a door lists what callers sent, it lists digests in their place.
            let listed = match door {
                Door::GoccRate => Some(get(s.reach.http, "/debug")),
                Door::LimitadorHttp => Some(get(s.reach.http, "/counters/doors")),
                _ => None,
            };
            if let Some(page) = listed {
                assert!(page.contains("\"#"), "{door:?}: no digest listed:\n{page}");
            }
        },
    );
}

#[test]
fn sighup_reads_every_file_a_door_follows_with_polling_off() {
    for mode in [Mode::Serve, Mode::Limitador] {
        let s = serve(mode, "127.0.0.1", &[("TURNSTILE_RELOAD_INTERVAL_MS", "0")]);
        let loads = |m: &str| series(m, "ratelimit_service_config_load_success_total");
        let before = loads(&get(s.reach.debug, "/metrics"));
        let text = std::fs::read_to_string(&s.file).unwrap();
        let (old, new) = match mode {
            Mode::Serve => ("requests_per_unit: 100", "requests_per_unit: 7"),
            Mode::Limitador => ("max_value: 100", "max_value: 7"),
        };
        std::fs::write(&s.file, text.replace(old, new)).unwrap();
        s.server.signal("HUP");
        let shown = match mode {
            Mode::Serve => "requests_per_unit=7",
            Mode::Limitador => "\"max_value\":7",
        };
        wait_for(&format!("{mode:?}: the SIGHUP reload"), || {
            let rl = get(s.reach.debug, "/rlconfig");
            (!rl.contains(shown)).then_some(rl)
        });
        let after = loads(&get(s.reach.debug, "/metrics"));
        assert!(after > before, "{mode:?}: loads {before} → {after}");
        s.server.stop();
    }
}

#[test]
fn while_the_start_waits_for_redis_every_door_says_so() {
    for mode in [Mode::Serve, Mode::Limitador] {
        let dir = TempDir::new("doors-waiting");
        let (program, mut args, mut env) = command(mode, &dir, "127.0.0.1");
        let [grpc, http_port, debug, resp] = [free_port(), free_port(), free_port(), free_port()];
        let redis_port = free_port();
        let set = |env: &mut Vec<(String, String)>, k: &str, v: String| {
            env.retain(|(name, _)| name != k);
            env.push((k.to_owned(), v));
        };
        set(&mut env, "DEBUG_PORT", debug.to_string());
        set(&mut env, "REDIS_STARTUP_INITIAL_INTERVAL", "50ms".into());
        set(&mut env, "REDIS_STARTUP_MAX_INTERVAL", "100ms".into());
        match mode {
            Mode::Serve => {
                set(&mut env, "PORT", http_port.to_string());
                set(&mut env, "GRPC_PORT", grpc.to_string());
                set(&mut env, "TURNSTILE_RESP_ADDR", format!("127.0.0.1:{resp}"));
                set(&mut env, "BACKEND_TYPE", "redis".into());
                set(&mut env, "REDIS_URL", format!("127.0.0.1:{redis_port}"));
            }
            Mode::Limitador => {
                args = [
                    "--http-port".to_owned(),
                    http_port.to_string(),
                    "--rls-port".into(),
                    grpc.to_string(),
                    dir.path().join("limits.yaml").display().to_string(),
                    "redis".into(),
                    format!("redis://127.0.0.1:{redis_port}"),
                ]
                .to_vec();
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let starting = Starting::spawn(&program, &args, &vars);
        starting.logged("Redis not reachable at start; retrying");
        let reach = Reach {
            grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
            http: SocketAddr::from(([127, 0, 0, 1], http_port)),
            debug: SocketAddr::from(([127, 0, 0, 1], debug)),
            resp: Some(SocketAddr::from(([127, 0, 0, 1], resp))),
        };
        for door in DOORS.into_iter().filter(|d| d.mode() == mode) {
            let answer = door.call(&reach, "alice");
            let why = answer.refusal(door);
            assert!(why.contains("waiting for Redis"), "{door:?}: {why}");
            assert!(!why.contains("Unimplemented"), "{door:?}: {why}");
        }
        drop(starting);
    }
}

#[test]
fn the_debug_port_shows_what_each_door_serves_and_where_it_came_from() {
    walk(
        |mode| serve(mode, "127.0.0.1", &[]),
        |door, s| {
            let rl = get(s.reach.debug, "/rlconfig");
            let limit = match door.mode() {
                Mode::Serve => "doors.user: unit=MINUTE requests_per_unit=100",
                Mode::Limitador => "\"namespace\":\"doors\"",
            };
            assert!(rl.contains(limit), "{door:?}: /rlconfig\n{rl}");
            let status = get(s.reach.debug, "/debug/status");
            let status: serde_json::Value = serde_json::from_str(&status).unwrap();
            let live = status["config"]["live"].to_string();
            let file = s.file.display().to_string();
            assert!(live.contains(&file), "{door:?}: {live} names not {file}");
            assert!(
                status["config"]["limits"].as_u64() >= Some(1),
                "{door:?}: {status}"
            );
        },
    );
}

#[test]
fn every_door_call_runs_in_a_span_named_for_its_door() {
    let env = [("LOG_LEVEL", "debug")];
    for mode in [Mode::Serve, Mode::Limitador] {
        let s = serve(mode, "127.0.0.1", &env);
        let doors: Vec<Door> = DOORS.into_iter().filter(|d| d.mode() == mode).collect();
        for door in &doors {
            assert_eq!(door.call(&s.reach, "alice"), Answer::Decided, "{door:?}");
        }
        let stderr = s.server.stop();
        for door in doors {
            let label = door.label();
            let answered = (stderr.lines())
                .filter(|l| l.contains("call{") && l.contains("answered"))
                .any(|l| {
                    l.contains(&format!("door=\"{label}\"")) || l.contains(&format!("door={label}"))
                });
            assert!(answered, "{door:?}: no span for its calls:\n{stderr}");
        }
    }
}

#[test]
fn every_http_port_closes_a_request_whose_headers_never_end() {
    let env = [("TURNSTILE_HTTP_HEADER_TIMEOUT", "1s")];
    for mode in [Mode::Serve, Mode::Limitador] {
        let s = serve(mode, "127.0.0.1", &env);
        for (port, at) in [("HTTP", s.reach.http), ("debug", s.reach.debug)] {
            let mut c = TcpStream::connect(at).unwrap();
            // Generous: a port that never closes fails here; one that closes passes at once.
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            c.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            let mut buf = [0u8; 512];
            match c.read(&mut buf) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                Err(e) => panic!("{mode:?}: the {port} port kept the connection: {e}"),
            }
        }
        s.server.stop();
    }
}
