//! Memory per active key: inserts N distinct keys through the engine (fixed window, one hit
//! each) and reports the growth of the process's resident set per key.
//!
//!   cargo run --release --example mem_per_key [N=1000000] [SHARDS=1]
//!
//! RSS is read from /proc/self/statm before the first key and at checkpoints. Each op is built
//! and sent the way the service layer does it (a fresh `String` key per request, dropped once
//! decided), so the delta is what the shard keeps: its entries, its key arena and its hash
//! index, with the index's spare buckets. Keys look like the service's counter keys,
//! `bench_api_key_user-0000042_` (27 bytes). The window is a day long, so no key expires
//! during the run; the example checks the shards still hold every key at the end.
//!
//! The example runs on glibc malloc, which returns large freed blocks to the kernel at once, so
//! the figure is the data structures'. The `turnstile` binary uses mimalloc, which keeps the
//! blocks freed while the table grows (see BENCHMARKS.md, "Memory per key").
//!
//! Output: one line per checkpoint:
//! `mem_per_key: keys=... rss_delta_bytes=... bytes_per_key=... minus_key_len=...`.

use std::time::Instant;

use turnstile::config::Algorithm;
use turnstile::limiter::key::Key;
use turnstile::limiter::{Clock, Engine, Op, Params, Role, State};

fn page_size() -> u64 {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Resident pages of this process (second field of /proc/self/statm).
fn resident_pages() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm resident field")
}

fn key(i: u64) -> String {
    format!("bench_api_key_user-{i:07}_")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(1_000_000, |a| a.parse().expect("N"));
    let shards: usize = args.next().map_or(1, |a| a.parse().expect("SHARDS"));
    let page = page_size();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    let (engine, tasks) = Engine::new(shards, 4096, 10_000, Clock::System);
    for t in tasks {
        local.spawn_local(t.run());
    }
    let params = Params {
        requests_per_unit: 1_000_000_000,
        window_ms: 86_400_000,
        algorithm: Algorithm::FixedWindow,
        calendar: None,
        tat: turnstile::limiter::Tat::Full,
    };
    let op = |k: String| Op {
        key: Key::new(k),
        params,
        hits: 1,
        refund: false,
        counting: turnstile::limiter::Counting::IfAdmitted,
        role: Role::Binding,
        queue: None,
        grant: None,
        local_first: None,
        reserve: turnstile::limiter::Reservation::None,
    };

    // Warm up the runtime, the channel and the allocator before the baseline.
    local.block_on(&rt, async {
        let d = engine
            .decide(vec![op("warm-up_".into())], false)
            .await
            .expect("decide");
        assert!(!d.outcomes[0].over);
    });
    let base = resident_pages();
    let key_len = key(0).len() as f64;
    eprintln!(
        "mem_per_key: {n} keys, {shards} shard(s), key length {key_len} bytes, \
         size_of::<State>() = {} bytes, page {page} bytes, baseline RSS {} KiB",
        std::mem::size_of::<State>(),
        base * page / 1024
    );

    let mut checkpoints: Vec<u64> = [100_000, 250_000, 500_000, 900_000, 917_000, 1_000_000]
        .into_iter()
        .filter(|c| *c < n)
        .collect();
    checkpoints.push(n);
    let start = Instant::now();
    local.block_on(&rt, async {
        let mut i = 0u64;
        for c in checkpoints {
            while i < c {
                let d = engine
                    .decide(vec![op(key(i))], false)
                    .await
                    .expect("decide");
                debug_assert!(!d.outcomes[0].over);
                i += 1;
            }
            let delta = (resident_pages().saturating_sub(base) * page) as f64;
            let per_key = delta / c as f64;
            println!(
                "mem_per_key: keys={c} rss_delta_bytes={delta:.0} bytes_per_key={per_key:.1} \
                 minus_key_len={:.1}",
                per_key - key_len
            );
        }
    });
    // Stats are updated on insert and on sweep; every key must still be held (+1: warm-up).
    let held: u64 = engine.stats().iter().map(|s| s.read().keys).sum();
    eprintln!(
        "mem_per_key: done in {:.2}s; shards hold {held} keys",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(held, n + 1, "keys expired or were dropped during the run");
}
