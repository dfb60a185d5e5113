//! Per-call cost on the request path: the hand-written counters (a relaxed atomic add, read at
//! scrape and flush) against prometheus-client's handles and families, and cadence's client
//! (a line formatted and handed to a sink on every call). Then one scrape of 16 families over
//! 4 shards, hand-written against prometheus-client's encoder. `weigh_text` prints what
//! prometheus-client writes for one of turnstile's families, to compare with /metrics.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use cadence::prelude::*;
use cadence::{NopMetricSink, StatsdClient};
use criterion::{criterion_group, criterion_main, Criterion};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

const SHARDS: usize = 4;
const FAMILIES: usize = 16;

type Labels = Vec<(&'static str, String)>;

fn per_call(c: &mut Criterion) {
    let mut g = c.benchmark_group("weigh_per_call");
    let hand = AtomicU64::new(0);
    g.bench_function("hand_atomic", |b| {
        b.iter(|| black_box(&hand).fetch_add(1, Ordering::Relaxed))
    });
    let counter: Counter = Counter::default();
    g.bench_function("prometheus_client_counter", |b| {
        b.iter(|| black_box(&counter).inc())
    });
    let family: Family<Labels, Counter> = Family::default();
    let labels: Labels = vec![("shard", "3".to_string())];
    g.bench_function("prometheus_client_family_get_or_create", |b| {
        b.iter(|| family.get_or_create(black_box(&labels)).inc())
    });
    let client = StatsdClient::from_sink("ratelimit", NopMetricSink);
    g.bench_function("cadence_count_nop_sink", |b| {
        b.iter(|| {
            client
                .count(black_box("service.rate_limit.d.k.total_hits"), 1)
                .ok()
        })
    });
    g.finish();
}

fn scrape(c: &mut Criterion) {
    let mut g = c.benchmark_group("weigh_scrape");
    let hand: Vec<Vec<AtomicU64>> = (0..FAMILIES)
        .map(|_| (0..SHARDS).map(|_| AtomicU64::new(7)).collect())
        .collect();
    let names: Vec<String> = (0..FAMILIES)
        .map(|i| format!("ratelimit_service_family_{i}_total"))
        .collect();
    g.bench_function("hand_text", |b| {
        b.iter(|| {
            let mut out = String::with_capacity(8192);
            for (name, shards) in names.iter().zip(&hand) {
                let _ = writeln!(out, "# HELP {name} Help.\n# TYPE {name} counter");
                for (i, s) in shards.iter().enumerate() {
                    let v = s.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {v}");
                }
            }
            black_box(out)
        })
    });
    let mut registry = Registry::default();
    for i in 0..FAMILIES {
        let f: Family<Labels, Counter> = Family::default();
        for s in 0..SHARDS {
            f.get_or_create(&vec![("shard", s.to_string())]).inc_by(7);
        }
        registry.register(format!("ratelimit_service_family_{i}"), "Help", f);
    }
    g.bench_function("prometheus_client_encode", |b| {
        b.iter(|| {
            let mut out = String::with_capacity(8192);
            encode(&mut out, &registry).unwrap();
            black_box(out)
        })
    });
    g.finish();
}

/// What prometheus-client writes for turnstile's request counter and histogram (printed once).
fn text(_: &mut Criterion) {
    use prometheus_client::metrics::histogram::Histogram;
    let mut registry = Registry::default();
    let requests: Counter = Counter::default();
    requests.inc();
    registry.register(
        "ratelimit_service_requests",
        "ShouldRateLimit calls answered or failed.",
        requests,
    );
    let h = Histogram::new([0.000025, 0.00005, 0.0001].into_iter());
    h.observe(0.00003);
    registry.register(
        "ratelimit_service_request_duration_seconds",
        "Time from a ShouldRateLimit call's arrival to its answer, queued waits included.",
        h,
    );
    let mut out = String::new();
    encode(&mut out, &registry).unwrap();
    println!("---- prometheus-client's text ----\n{out}----");
}

criterion_group!(benches, per_call, scrape, text);
criterion_main!(benches);
