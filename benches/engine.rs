//! Engine micro-benchmarks (criterion).
//!
//!   cargo bench --bench engine -- --warm-up-time 1 --measurement-time 3
//!   cargo bench --bench engine -- state_eval        # one group only
//!
//! Groups (throughput is in descriptors, i.e. ops, per second):
//!
//! - `engine_decide`: `Engine::decide` as a server worker runs it. A tokio current-thread
//!   runtime with the shard tasks in its `LocalSet`, `Engine::new(shards, 4096, 10000,
//!   Clock::System)`; the caller is the `block_on` future on the same thread, like a gRPC
//!   handler on the worker that owns the shard, so it decides synchronously.
//!   `hot_key_other_thread` puts the shard on another thread: each decide is then a message
//!   and a reply, as for a handler on another worker. Each call clones a pre-built op (one
//!   `String` allocation for the key, as the service layer pays when it builds the key).
//!   Limits are high (1e9 per second) so answers are OK, except in `over_limit`.
//! - `engine_concurrent`: 64 decides joined at once, so the shard's `recv_many` gets batches.
//! - `state_eval`: `State::eval` alone, per algorithm: the counting maths, the ceiling.
//! - `service_decide`: `EnvoyService::decide` (validation, matching, key building, engine,
//!   answer) against `benches/load/bench.conf.yaml`, for the load harness's request mixes. Each
//!   call clones the request (as decoding would allocate it). Heavy hitters are kept as the
//!   server keeps them (20 per limit); the `*_no_top` rows turn them off (`TURNSTILE_TOP_N=0`),
//!   so the difference is their cost. `distinct` sends a new value every call (a key flood).
//! - `config_load`: `Config::from_sources` on one domain of tenants, each with a limit and a
//!   child, at 1 000, 10 000 and 100 000 descriptors (throughput in descriptors): the time per
//!   descriptor stays flat when loading is linear in the config's size.
//! - `wildcard_match`: `descriptor::find` for one entry whose value matches the first or the
//!   last of 10 and of 2 000 wildcard patterns on one key (`value: p0000-*` ...): the last is
//!   found as fast as the first when matching does not scan the patterns.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message as _;
use tokio::runtime::Runtime;
use tokio::task::LocalSet;

use turnstile::config::{Algorithm, Config, LoadOptions};
use turnstile::descriptor::{self, Entry as MatchEntry};
use turnstile::hitters::TopTable;
use turnstile::limiter::key::Key;
use turnstile::limiter::{Clock, Engine, Op, Params, Role, State};
use turnstile::service::metrics::RequestStats;
use turnstile::service::{AnswerSettings, EnvoyService, LiveLimits, RequestLimits};
use turnstile::transport::codec::read_request;

/// The allocator the `turnstile` binary uses, so allocation costs match the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HIGH: u32 = 1_000_000_000;
const DISTINCT: usize = 1_000_000;
const IN_FLIGHT: usize = 64;

const ALGORITHMS: [(&str, Algorithm); 3] = [
    ("fixed_window", Algorithm::FixedWindow),
    ("sliding_window", Algorithm::SlidingWindow),
    ("token_bucket", Algorithm::TokenBucket { burst: HIGH }),
];

fn params(algorithm: Algorithm, requests_per_unit: u32, window_secs: u64) -> Params {
    Params {
        requests_per_unit,
        window_ms: window_secs * 1000,
        algorithm,
        calendar: None,
        tat: turnstile::limiter::Tat::Full,
    }
}

fn op(key: &str, params: Params) -> Op {
    Op {
        key: Key::new(key),
        params,
        hits: 1,
        refund: false,
        counting: turnstile::limiter::Counting::IfAdmitted,
        role: Role::Binding,
        queue: None,
        grant: None,
        local_first: None,
        reserve: turnstile::limiter::Reservation::None,
    }
}

/// A current-thread runtime (time enabled, for the shard's sweep timer) and the `LocalSet` the
/// shard tasks run in, as on a server worker.
struct Rt {
    rt: Runtime,
    local: LocalSet,
}

impl Rt {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.local.block_on(&self.rt, f)
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// `shards` shard actors on the caller's thread: decides run synchronously, as for a gRPC
/// handler on the worker that owns the shard.
fn engine(shards: usize) -> (Rt, Engine) {
    let rt = Rt {
        rt: runtime(),
        local: LocalSet::new(),
    };
    let (engine, tasks) = Engine::new(shards, 4096, 10_000, Clock::System);
    for t in tasks {
        rt.local.spawn_local(t.run());
    }
    (rt, engine)
}

/// `shards` shard actors on a thread of their own: every decide is a message and a reply, as
/// for a handler on another worker (or the admin thread).
fn engine_elsewhere(shards: usize) -> (Rt, Engine) {
    let (engine, tasks) = Engine::new(shards, 4096, 10_000, Clock::System);
    std::thread::spawn(move || {
        let local = LocalSet::new();
        for t in tasks {
            local.spawn_local(t.run());
        }
        local.block_on(&runtime(), std::future::pending::<()>());
    });
    let rt = Rt {
        rt: runtime(),
        local: LocalSet::new(),
    };
    (rt, engine)
}

/// Times `iters` sequential decides; `make(i)` gives the ops of call `i`.
fn sequential(
    rt: &Rt,
    engine: &Engine,
    iters: u64,
    mut make: impl FnMut(u64) -> Vec<Op>,
    expect_over: bool,
) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        for i in 0..iters {
            let d = engine.decide(make(i), false).await.expect("decide");
            debug_assert!(d.outcomes.iter().all(|o| o.over == expect_over));
            black_box(d);
        }
        start.elapsed()
    })
}

/// Times `iters` rounds of `IN_FLIGHT` decides joined together.
fn concurrent(
    rt: &Rt,
    engine: &Engine,
    iters: u64,
    mut make: impl FnMut(u64) -> Vec<Op>,
) -> Duration {
    rt.block_on(async {
        let mut n = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            let futs = (0..IN_FLIGHT).map(|_| {
                n += 1;
                engine.decide(make(n), false)
            });
            for d in futures_util::future::join_all(futs).await {
                black_box(d.expect("decide"));
            }
        }
        start.elapsed()
    })
}

fn distinct_ops(p: Params) -> Vec<Op> {
    (0..DISTINCT)
        .map(|i| op(&format!("bench_api_key_user-{i:07}_"), p))
        .collect()
}

/// The four counter keys of the load harness's `multi` mix.
const MULTI_KEYS: [&str; 4] = [
    "bench_api_key_k1_",
    "bench_api_key_k1_path_/a_",
    "bench_remote_address_10.0.0.1_",
    "bench_tenant_t1_",
];

fn engine_decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_decide");
    g.throughput(Throughput::Elements(1));

    // One hot key, per algorithm.
    for (name, alg) in ALGORITHMS {
        let (rt, e) = engine(1);
        let o = op("bench_api_key_k1_", params(alg, HIGH, 1));
        g.bench_function(BenchmarkId::new("hot_key", name), |b| {
            b.iter_custom(|iters| sequential(&rt, &e, iters, |_| vec![o.clone()], false))
        });
    }

    // A million distinct keys, cycled: inserts, then updates of entries from older windows
    // (and the once-a-second sweep dropping expired ones).
    for (name, alg) in ALGORITHMS {
        let (rt, e) = engine(1);
        let ops = distinct_ops(params(alg, HIGH, 1));
        g.bench_function(BenchmarkId::new("distinct_1m", name), |b| {
            b.iter_custom(|iters| {
                let mut k = 0usize;
                sequential(
                    &rt,
                    &e,
                    iters,
                    |_| {
                        k = if k + 1 == DISTINCT { 0 } else { k + 1 };
                        vec![ops[k].clone()]
                    },
                    false,
                )
            })
        });
    }

    // Over the limit: the key's 1 request per minute is used up by the first call.
    {
        let (rt, e) = engine(1);
        let o = op("bench_blocked_yes_", params(Algorithm::FixedWindow, 1, 60));
        g.bench_function(BenchmarkId::new("over_limit", "fixed_window"), |b| {
            b.iter_custom(|iters| sequential(&rt, &e, iters, |_| vec![o.clone()], true))
        });
    }

    // The hot key again, with the shard on another thread: the message path.
    {
        let (rt, e) = engine_elsewhere(1);
        let o = op("bench_api_key_k1_", params(Algorithm::FixedWindow, HIGH, 1));
        g.bench_function(
            BenchmarkId::new("hot_key_other_thread", "fixed_window"),
            |b| b.iter_custom(|iters| sequential(&rt, &e, iters, |_| vec![o.clone()], false)),
        );
    }

    // Four ops in one decide (the `multi` mix's keys), on one shard (one message) and on two
    // (as `--workers 2` lays them out: the request spans both shards and takes the multi-part path).
    g.throughput(Throughput::Elements(4));
    for shards in [1usize, 2] {
        let (rt, e) = engine(shards);
        let four: Vec<Op> = MULTI_KEYS
            .iter()
            .map(|k| op(k, params(Algorithm::FixedWindow, HIGH, 1)))
            .collect();
        let placement: Vec<usize> = four.iter().map(|o| e.shard_for(o.key.hash())).collect();
        eprintln!("four_ops on {shards} shard(s): ops go to shards {placement:?}");
        g.bench_function(
            BenchmarkId::new("four_ops", format!("fixed_window/{shards}_shards")),
            |b| b.iter_custom(|iters| sequential(&rt, &e, iters, |_| four.clone(), false)),
        );
    }
    g.finish();
}

fn engine_concurrent(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_concurrent");
    g.throughput(Throughput::Elements(IN_FLIGHT as u64));
    {
        let (rt, e) = engine(1);
        let o = op("bench_api_key_k1_", params(Algorithm::FixedWindow, HIGH, 1));
        g.bench_function(BenchmarkId::new("in_flight_64", "hot_key"), |b| {
            b.iter_custom(|iters| concurrent(&rt, &e, iters, |_| vec![o.clone()]))
        });
    }
    {
        let (rt, e) = engine_elsewhere(1);
        let o = op("bench_api_key_k1_", params(Algorithm::FixedWindow, HIGH, 1));
        g.bench_function(
            BenchmarkId::new("in_flight_64", "hot_key_other_thread"),
            |b| b.iter_custom(|iters| concurrent(&rt, &e, iters, |_| vec![o.clone()])),
        );
    }
    {
        let (rt, e) = engine(1);
        let ops = distinct_ops(params(Algorithm::FixedWindow, HIGH, 1));
        g.bench_function(BenchmarkId::new("in_flight_64", "distinct_1m"), |b| {
            b.iter_custom(|iters| {
                concurrent(&rt, &e, iters, |n| {
                    vec![ops[(n % DISTINCT as u64) as usize].clone()]
                })
            })
        });
    }
    g.finish();
}

fn state_eval(c: &mut Criterion) {
    let mut g = c.benchmark_group("state_eval");
    g.throughput(Throughput::Elements(1));
    let now = 1_763_700_000_123_456_789u64;
    for (name, alg) in ALGORITHMS {
        let p = params(alg, HIGH, 1);
        // A state with some history: a few hits earlier in the window / bucket.
        let st = State::fresh(&p, now - 1_000).eval(&p, now - 1_000, 5).next;
        g.bench_function(name, |b| {
            b.iter(|| black_box(black_box(st).eval(black_box(&p), black_box(now), black_box(1))))
        });
    }
    g.finish();
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The limiter `service_decide` runs against: one shard on the caller's thread, heavy hitters
/// kept for `top_n` values per limit (the server's default is 20; 0 keeps none).
fn bench_limiter(top_n: usize) -> (Rt, EnvoyService) {
    let yaml = include_str!("load/bench.conf.yaml").to_owned();
    let config = Config::from_sources(&[("bench.conf.yaml".into(), yaml)], LoadOptions::default())
        .expect("bench config");
    let (rt, e) = engine(1);
    let metrics = Arc::new(RequestStats::new(0.8));
    let top = Arc::new(TopTable::new(top_n).with_sample(turnstile::hitters::DEFAULT_SAMPLE));
    top.tick(e.clock().now());
    let live = LiveLimits::new(config, metrics.clone(), top);
    let limiter = EnvoyService::new(
        live,
        e,
        AnswerSettings {
            response_headers: None,
            global_shadow_mode: false,
            request_limits: RequestLimits::default(),
            counting_rule: Default::default(),
            global_quota_mode: false,
            response_dynamic_metadata: false,
            refused_by_metadata: false,
        },
        metrics,
    );
    (rt, limiter)
}

fn service_decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("service_decide");
    // Usage reported after the response (a descriptor's own hits_addend), counted in full:
    // within its budget, and past it (stored over the limit, never given back).
    let report = |entries: &[(&str, &str)]| RateLimitDescriptor {
        hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 }),
        ..descriptor(entries)
    };
    let mixes: [(&str, Vec<RateLimitDescriptor>, Code); 5] = [
        ("one", vec![descriptor(&[("api_key", "k1")])], Code::Ok),
        ("report", vec![report(&[("api_key", "k1")])], Code::Ok),
        (
            "report_over",
            vec![report(&[("blocked", "yes")])],
            Code::OverLimit,
        ),
        (
            "multi",
            vec![
                descriptor(&[("api_key", "k1")]),
                descriptor(&[("api_key", "k1"), ("path", "/a")]),
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("tenant", "t1")]),
            ],
            Code::Ok,
        ),
        (
            "over",
            vec![descriptor(&[("blocked", "yes")])],
            Code::OverLimit,
        ),
    ];
    // Each mix as the server runs it (heavy hitters on, 20 per limit) and without them, one
    // right after the other so that a change in the machine's load falls on both alike.
    let limiters = [("", bench_limiter(20)), ("_no_top", bench_limiter(0))];
    for (name, descriptors, want) in &mixes {
        for (suffix, (rt, limiter)) in &limiters {
            g.throughput(Throughput::Elements(descriptors.len() as u64));
            let req = RateLimitRequest {
                domain: "bench".into(),
                descriptors: descriptors.clone(),
                hits_addend: 0,
            };
            // As the gRPC adapter does: the request read from its bytes, then decided.
            let bytes = req.encode_to_vec();
            let read = || read_request(black_box(&bytes)).expect("a request");
            let check = rt.block_on(limiter.decide(&read())).expect("decide");
            assert_eq!(check.overall_code, *want as i32, "mix {name}");
            g.bench_function(format!("{name}{suffix}"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            black_box(limiter.decide(&read()).await.expect("decide"));
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    // A flood of distinct values (a new `api_key` each call, from a million): every value is
    // new to the heavy hitters, which then evict the lightest slot.
    for (suffix, (rt, limiter)) in &limiters {
        let mut req = RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![descriptor(&[("api_key", "k0")])],
            hits_addend: 0,
        };
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("distinct{suffix}"), |b| {
            let mut i = 0usize;
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        i = (i + 1) % DISTINCT;
                        let value = &mut req.descriptors[0].entries[0].value;
                        value.clear();
                        let _ = write!(value, "k{i}");
                        let bytes = req.encode_to_vec();
                        let read = read_request(&bytes).expect("a request");
                        black_box(limiter.decide(&read).await.expect("decide"));
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

/// `BoundTop::record` alone, as the answer calls it once per descriptor: a value already
/// tracked, one over its limit, and a new value every call (a flood, evicting).
fn top_record(c: &mut Criterion) {
    let mut g = c.benchmark_group("top_record");
    let yaml = include_str!("load/bench.conf.yaml").to_owned();
    let config = Config::from_sources(&[("bench.conf.yaml".into(), yaml)], LoadOptions::default())
        .expect("bench config");
    let table = TopTable::new(20);
    let bound = table.bind(&config);
    let mut node = None;
    config.for_each_node(&mut |n| {
        if &*n.stat_key == "bench.remote_address" {
            node = Some(n);
        }
    });
    let node = node.expect("bench.remote_address");
    let mut entries = vec![Entry {
        key: "remote_address".into(),
        value: "10.0.0.1".into(),
    }];
    fn view(entries: &[Entry]) -> Vec<turnstile::descriptor::Entry<'_>> {
        entries.iter().map(Into::into).collect()
    }
    g.throughput(Throughput::Elements(1));
    let tracked = view(&entries);
    g.bench_function("tracked", |b| {
        b.iter(|| bound.record(node, black_box(&tracked), 1, false, false))
    });
    g.bench_function("tracked_over", |b| {
        b.iter(|| bound.record(node, black_box(&tracked), 1, true, true))
    });
    let mut i = 0usize;
    g.bench_function("distinct", |b| {
        b.iter(|| {
            i = (i + 1) % DISTINCT;
            let value = &mut entries[0].value;
            value.clear();
            let _ = write!(value, "10.{}.{}", i >> 8, i & 255);
            bound.record(node, black_box(&view(&entries)), 1, false, false)
        })
    });
    g.finish();
}

/// One domain of `tenants` tenants, each a limit and one child with a limit.
fn saas_yaml(tenants: usize) -> String {
    let mut y = String::from("domain: saas\ndescriptors:\n");
    for i in 0..tenants {
        let _ = write!(
            y,
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: path\n        rate_limit: {{unit: second, requests_per_unit: 10}}\n"
        );
    }
    y
}

fn config_load(c: &mut Criterion) {
    let mut g = c.benchmark_group("config_load");
    g.sample_size(10);
    for descriptors in [1_000usize, 10_000, 100_000] {
        let sources = vec![("saas.yaml".to_owned(), saas_yaml(descriptors / 2))];
        g.throughput(Throughput::Elements(descriptors as u64));
        g.bench_function(BenchmarkId::from_parameter(descriptors), |b| {
            b.iter(|| Config::from_sources(black_box(&sources), LoadOptions::default()).unwrap())
        });
    }
    g.finish();
}

/// One domain with `patterns` wildcard patterns on one key, `p0000-*` to the last, in order.
fn wildcard_yaml(patterns: usize) -> String {
    let mut y = String::from("domain: wild\ndescriptors:\n");
    for i in 0..patterns {
        let _ = write!(
            y,
            "  - key: path\n    value: p{i:04}-*\n    rate_limit: {{unit: second, requests_per_unit: 10}}\n"
        );
    }
    y
}

fn wildcard_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("wildcard_match");
    g.throughput(Throughput::Elements(1));
    for patterns in [10usize, 2_000] {
        let sources = vec![("wild.yaml".to_owned(), wildcard_yaml(patterns))];
        let config = Config::from_sources(&sources, LoadOptions::default()).unwrap();
        let domain = config.domain("wild").unwrap();
        for (which, at) in [("first", 0), ("last", patterns - 1)] {
            let value = format!("p{at:04}-x");
            let entries = [MatchEntry {
                key: "path",
                value: &value,
            }];
            let want = format!("p{at:04}-*");
            let m = descriptor::find(domain, &entries).unwrap();
            assert_eq!(m.node().value.as_deref(), Some(want.as_str()));
            g.bench_function(BenchmarkId::new(which, patterns), |b| {
                b.iter(|| descriptor::find(black_box(domain), black_box(&entries)).is_some())
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    config_load,
    wildcard_match,
    top_record,
    engine_decide,
    engine_concurrent,
    state_eval,
    service_decide
);
criterion_main!(benches);
