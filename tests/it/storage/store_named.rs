//! What the store is, said at start through the binary: its name and version, and a store
//! that runs no scripts (a Valkey whose Lua module is unloaded, `MODULE UNLOAD lua`) named with
//! its answer; a limit that needs scripts is refused there, at start and on a reload, and fixed
//! windows count on `INCRBY` (refunds by `DECRBY`), never failing at call time.

use std::time::Duration;

use crate::common::binary::{self, block_on, request, wait_for, Server, Starting, BIN};
use crate::common::redis::{server_program, Redis};
use crate::common::tempdir::TempDir;

const FIXED: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

fn env(r: &Redis) -> Vec<(String, String)> {
    crate::common::redis::env(r, "named_")
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The name and version `INFO server` gives, as the start should log them.
fn named(r: &Redis) -> (String, String) {
    let info = r.cli(&["INFO", "server"]);
    let field = |f: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(f)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let name = field("server_name").unwrap_or_else(|| "redis".to_owned());
    let version = field(&format!("{name}_version")).expect("a version");
    (name, version)
}

#[test]
fn the_store_is_named_at_start_with_its_version() {
    let r = Redis::start();
    let (name, version) = named(&r);
    if server_program().contains("valkey") {
        assert_eq!(name, "valkey");
    }
    let t = TempDir::new("store-named");
    let config = t.write("limits.yaml", FIXED);
    let env = env(&r);
    let args = ["serve", "--config", config.to_str().unwrap()];
    let server = Server::start(BIN.as_ref(), &args, &pairs(&env));
    let stderr = server.stop();
    let want = format!("store={name} version={version} scripts=true");
    assert!(stderr.contains(&want), "{want:?} not in:\n{stderr}");
    assert!(stderr.contains("store connected"), "{stderr}");
}

#[test]
fn a_store_without_scripts_is_named_at_start_and_fixed_windows_count_there() {
    let v = Redis::valkey_without_lua();
    let (_, version) = named(&v);
    let t = TempDir::new("no-scripts");
    let path = t.write("limits.yaml", FIXED);
    let env = env(&v);
    let args = ["serve", "--config", path.to_str().unwrap()];
    let start = Starting::spawn(BIN.as_ref(), &args, &pairs(&env));
    start.logged("cannot run turnstile's scripts");
    let server = start.ready();
    let stderr = server.stderr();
    for want in [
        format!("store=valkey version={version} scripts=false"),
        "Could not find scripting engine 'lua'".to_owned(),
        "sliding windows, token buckets".to_owned(),
    ] {
        assert!(stderr.contains(&want), "{want:?} not in:\n{stderr}");
    }

    // Two admitted, the third refused: its hits go back by DECRBY, no script asked.
    let grpc = server.ports.grpc_addr();
    let codes: Vec<i32> = (0..3)
        .map(|_| block_on(binary::call(grpc, request("d", "k", "x"), &[])).overall_code)
        .collect();
    assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
    let key = v.cli(&["KEYS", "named_d_k_x_*"]);
    assert!(!key.is_empty(), "the window's key");
    wait_for("the refused call's hits refunded", || {
        let n = v.cli(&["GET", &key]);
        (n != "2").then_some(n)
    });
    let ttl: i64 = v.cli(&["PTTL", &key]).parse().unwrap();
    assert!(ttl > 0, "the window's key keeps its TTL: {ttl}");

    // A reload that brings a limit needing scripts is kept out, naming it and why.
    let sliding = FIXED.replace(
        "requests_per_unit: 2}",
        "requests_per_unit: 2, algorithm: sliding_window}",
    );
    std::fs::write(&path, sliding).unwrap();
    wait_for("the reload kept out", || {
        let e = server.stderr();
        (!e.contains("config reload failed")).then_some(e)
    });
    let code = block_on(binary::call(grpc, request("d", "k", "x"), &[])).overall_code;
    assert_eq!(code, 2, "the fixed window stays live");
    let stderr = server.stop();
    for want in [
        "d.k",
        "sliding_window counts through a script",
        "REDIS_URL (valkey",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
    assert!(!stderr.contains("round trip failed"), "{stderr}");
}

#[test]
fn a_limit_that_needs_scripts_stops_the_start_on_a_store_without_them() {
    let v = Redis::valkey_without_lua();
    let t = TempDir::new("no-scripts-start");
    let env = env(&v);
    let cases = [
        (
            "algorithm: sliding_window",
            "sliding_window counts through a script",
        ),
        (
            "algorithm: token_bucket, burst: 2",
            "token_bucket counts through a script",
        ),
        ("reserve: 1", "`reserve` holds through a script"),
    ];
    for (field, why) in cases {
        let yaml = FIXED.replace(
            "requests_per_unit: 2}",
            &format!("requests_per_unit: 2, {field}}}"),
        );
        let path = t.write("limits.yaml", &yaml);
        let args = ["serve", "--config", path.to_str().unwrap()];
        let mut start = Starting::spawn(BIN.as_ref(), &args, &pairs(&env));
        let (status, stderr) = start
            .exit_within(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{field}: the start went on"));
        assert!(!status.success(), "{field}: {stderr}");
        for want in [
            "limits.yaml",
            "d.k",
            why,
            "Could not find scripting engine 'lua'",
        ] {
            assert!(stderr.contains(want), "{field}: {want:?} not in:\n{stderr}");
        }
    }
}
