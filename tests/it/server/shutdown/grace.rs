//! Shutdown as configuration.md, SECURITY.md and examples/kubernetes/README.md say: the process
//! exits at the end of `TURNSTILE_SHUTDOWN_GRACE_SECONDS` even while a client holds a gRPC
//! connection open, and until the drain ends `/healthcheck` answers 500 on new connections (as
//! envoyproxy/ratelimit's HTTP listener does: it closes only after gRPC's graceful stop).

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::common::run::*;
use crate::common::tempdir::TempDir;

/// A raw h2c connection that says hello and then nothing: it answers no PING and never closes,
/// so a graceful close of it can only end by the server giving up.
fn held_h2c(grpc: &str) -> TcpStream {
    let mut s = TcpStream::connect(grpc).expect("connect to gRPC");
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    // The server's SETTINGS: the connection is served.
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    assert_eq!(frame(&mut s), 4, "the server's first frame is SETTINGS");
    s
}

/// The type of the next frame the server sends (its payload read and dropped).
fn frame(s: &mut TcpStream) -> u8 {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).expect("a frame");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).expect("the frame's payload");
    head[3]
}

fn serving(grace: &str) -> (TempDir, Server) {
    let dir = TempDir::new("grace");
    let config = config_dir(dir.path(), SIMPLE);
    let s = serve(
        &["serve", "--config", config.to_str().unwrap()],
        &[("TURNSTILE_SHUTDOWN_GRACE_SECONDS", grace)],
    );
    (dir, s)
}

#[test]
fn exits_at_the_grace_end_while_a_client_holds_a_connection() {
    let (_dir, mut s) = serving("1");
    let held = held_h2c(&s.ports.grpc);
    s.signal("TERM");
    wait_for("exit with the connection still held", || {
        (!s.exited()).then(|| s.stderr())
    });
    drop(held);
}

/// Reads frames until the server's GOAWAY: from then on the server is draining.
fn wait_goaway(s: &mut TcpStream) {
    while frame(s) != 7 {}
}

#[test]
fn healthcheck_answers_500_until_the_drain_ends() {
    // The drain lasts until the held connection is given up on: long enough to probe, and
    // nothing here depends on how long.
    let (_dir, mut s) = serving("20");
    let mut held = held_h2c(&s.ports.grpc);
    assert_eq!(http_get(s.ports.http, "/healthcheck").map(|r| r.0), Ok(200));
    s.signal("TERM");
    wait_goaway(&mut held);
    // Draining now, and until the grace ends: every new probe is answered, with 500.
    for probe in 0..50 {
        let got = http_get(s.ports.http, "/healthcheck");
        assert_eq!(
            got.as_ref().map(|r| r.0),
            Ok(500),
            "probe {probe} in the drain: {got:?}"
        );
    }
    assert!(!s.exited(), "exited before the grace ended");
    drop(held);
}
