//! A start that fails names what the `limitador-server` user wrote (its flags, its variables,
//! its storage's arguments), never the turnstile settings they stand for.

use std::net::TcpListener;

use super::redis::refused;
use super::*;
use crate::common::binary::Starting;
use crate::common::redis::Redis;

#[test]
fn a_refused_redis_password_names_the_url() {
    let r = Redis::start_with(&["--requirepass", "right"]);
    let url = format!("redis://:wrong@127.0.0.1:{}", r.port);
    let stderr = refused(&["redis", url.as_str()], &[]);
    assert!(
        stderr.contains("check the password in the Redis URL"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("REDIS_AUTH") && !stderr.contains("wrong"),
        "{stderr}"
    );
}

#[test]
fn a_held_disk_path_names_the_storage() {
    let state = TempDir::new("limitador-disk-held");
    let path = state.path().to_str().unwrap().to_owned();
    let _first = Limitador::start_on(&[], LIMITS, &["disk", path.as_str()], &[]);
    let stderr = refused(&["disk", path.as_str()], &[]);
    assert!(stderr.contains("the storage `disk PATH`"), "{stderr}");
    assert!(!stderr.contains("TURNSTILE_STATE_DIR"), "{stderr}");
}

/// Needs src/server/listeners.rs to name the ports by `Settings::port_names` (issue 62: the
/// listeners are being reworked beside this change).
#[test]
fn a_taken_port_names_the_flag() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = TempDir::new("limitador-port-taken");
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    let exe = limitador_server(dir.path());
    let env = [
        ("ENVOY_RLS_HOST", "127.0.0.1"),
        ("HTTP_API_HOST", "127.0.0.1"),
    ];
    for (flag, other, named) in [
        ("-P", "--rls-port", "-P/--http-port"),
        ("-p", "--http-port", "-p/--rls-port"),
    ] {
        let args = [flag, port.as_str(), other, "0", file.to_str().unwrap()];
        let mut s = Starting::spawn(&exe, &args, &env);
        let (status, stderr) = s
            .exit_within(std::time::Duration::from_secs(30))
            .expect("refused at start");
        assert!(!status.success(), "{stderr}");
        assert!(stderr.contains(named), "{flag}: {stderr}");
        assert!(
            !stderr.contains("GRPC_PORT") && !stderr.contains("(HOST, PORT)"),
            "{stderr}"
        );
    }
}

/// Under `serve` too: a port past 65535 is out of range, not "not a whole number".
#[test]
fn a_port_out_of_range_says_so() {
    let stderr = crate::common::binary::start_fails(&["serve"], &[("GRPC_PORT", "99999")]);
    assert!(
        stderr.contains("GRPC_PORT=99999 is out of range"),
        "{stderr}"
    );
}
