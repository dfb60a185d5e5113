//! An xDS management server for measuring a big push: serves one `RateLimitConfig` (domain
//! `saas`) of N tenants, each a `tenant` value with a limit and a child `path` limit (2N
//! descriptors, the shape `benches/load/config_load.py` writes as YAML), to every turnstile that
//! subscribes over ADS.
//!
//! ```sh
//! cargo run --release --example xds_serve -- 50000
//! ```
//!
//! Prints `xds_serve: listening <addr> bytes=<size of the resource>`, then pushes a new version
//! for every number read on stdin: the last tenant's `requests_per_unit` set to it.
//! `benches/load/config_load.py --xds` drives it.

use std::io::BufRead;

use prost::Message;

// The test suite's ADS server, the one `ops::xds` and `image` run turnstile against.
#[allow(dead_code, unreachable_pub)]
#[path = "../tests/it/common/ads.rs"]
mod ads;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let tenants: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: xds_serve <tenants>");
            std::process::exit(2);
        }
    };
    let server = ads::Ads::start().await;
    let first = ads::saas(tenants, 7);
    let bytes = first.encoded_len();
    server.push("1", vec![first]);
    println!("xds_serve: listening {} bytes={bytes}", server.addr);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut version = 1;
    while let Some(line) = rx.recv().await {
        let Ok(rpu) = line.trim().parse() else {
            eprintln!("xds_serve: not a number: {line}");
            continue;
        };
        version += 1;
        server.push(&version.to_string(), vec![ads::saas(tenants, rpu)]);
    }
}
