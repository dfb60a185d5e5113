//! Decisions per second through the engine, in memory and through Redis, measured in one run.
//!
//! Starts its own `redis-server` on a free port, then drives both engines with the same load:
//! `CONCURRENCY` callers (default 256) each deciding single-descriptor requests on one of
//! `KEYS` keys (default 10000) for `SECONDS` (default 5) each.
//!
//!     cargo run --release --example backing_bench
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::config::Algorithm;
use turnstile::limiter::key::Key;
use turnstile::limiter::{Clock, Engine, EngineSizes, Op, Params, Role, SharedStore, Store};
use turnstile::settings::Settings;
use turnstile::store::redis::{RedisErrors, RedisStore, StartupRetries};

fn env_num(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

async fn drive(
    engine: Engine,
    concurrency: u64,
    keys: u64,
    secs: u64,
) -> (f64, Duration, Duration) {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let engine = engine.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = t;
            while Instant::now() < stop {
                let key = format!("bench_k_{}_", i % keys);
                i += concurrency;
                let op = Op {
                    key: Key::new(key),
                    params: Params {
                        requests_per_unit: 1_000_000_000,
                        window_ms: 60_000,
                        algorithm: Algorithm::FixedWindow,
                        calendar: None,
                        tat: turnstile::limiter::Tat::Full,
                    },
                    hits: 1,
                    refund: false,
                    counting: turnstile::limiter::Counting::IfAdmitted,
                    role: Role::Binding,
                    queue: None,
                    grant: None,
                    local_first: None,
                    reserve: turnstile::limiter::Reservation::None,
                };
                let start = Instant::now();
                engine.decide(vec![op], false).await.expect("decided");
                lat.push(start.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
            lat
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (
        done.load(Ordering::Relaxed) as f64 / elapsed,
        pct(0.5),
        pct(0.99),
    )
}

/// The engine's sizes but its shards: room enough that nothing is shed or evicted.
const SIZES: EngineSizes = EngineSizes {
    shards: 1,
    messages: 65_536,
    max_waiters: 10_000,
    max_keys: usize::MAX,
};

fn main() {
    let concurrency = env_num("CONCURRENCY", 256);
    let keys = env_num("KEYS", 10_000);
    let secs = env_num("SECONDS", 5);
    let shards = env_num("SHARDS", 2) as usize;
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let rows = local.block_on(&rt, async {
        let url = format!("127.0.0.1:{port}");
        let env = |k: &str| match k {
            "BACKEND_TYPE" => Some("redis".to_string()),
            "REDIS_URL" => Some(url.clone()),
            "REDIS_POOL_SIZE" => Some(shards.to_string()),
            "TURNSTILE_REDIS_DEADLINE_MS" => Some("1000".into()),
            // The redis-server just started: retried until it answers.
            "REDIS_STARTUP_INITIAL_INTERVAL" => Some("50ms".into()),
            _ => None,
        };
        let settings = Settings::from_env(env)
            .unwrap()
            .storage
            .redis()
            .cloned()
            .unwrap();
        let (retries, errors) = (StartupRetries::default(), Arc::new(RedisErrors::new(1)));
        let store = RedisStore::connect(&settings, &retries, &errors);
        let store = store.await.unwrap();
        let store: Arc<dyn Store> = Arc::new(store);
        let policy = settings.policy.clone();
        let mut rows = Vec::new();
        for (name, redis) in [
            ("memory", None),
            ("redis", Some(SharedStore { store, policy })),
        ] {
            let sizes = EngineSizes { shards, ..SIZES };
            let (engine, tasks) = Engine::with_store(sizes, Clock::System, redis);
            for t in tasks {
                tokio::task::spawn_local(t.run());
            }
            rows.push((name, drive(engine, concurrency, keys, secs).await));
        }
        rows
    });
    let _ = redis.kill();
    let _ = redis.wait();
    let base = rows[0].1 .0;
    println!("| backing | decisions/s | p50 | p99 | vs memory |");
    println!("|---|---:|---:|---:|---:|");
    for (name, (rate, p50, p99)) in rows {
        println!(
            "| {name} | {rate:.0} | {p50:?} | {p99:?} | {:.2} |",
            rate / base
        );
    }
    println!("\n{concurrency} callers, {keys} keys, {secs} s each, {shards} shards, one current-thread runtime (redis-server on the other core)");
}
