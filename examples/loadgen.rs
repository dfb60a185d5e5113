//! A small closed-loop gRPC load generator for `ShouldRateLimit`.
//!
//! h2load is the main driver in `benches/load/run.sh`, but it cannot do two
//! things this harness needs:
//!
//! * the `distinct` mix: h2load sends the same `-d` body on every request,
//!   so it cannot put a fresh descriptor value on each call;
//! * a gRPC-level check: h2load counts HTTP 200 as success, and a gRPC error
//!   (e.g. UNIMPLEMENTED) also travels as HTTP 200 + `grpc-status` trailer.
//!
//! So this tool sends the same mixes as `make_body.py` (plus `distinct`),
//! decodes every response, counts OK / OVER_LIMIT / errors, and reports
//! latency percentiles from the exact per-request samples (sorted, no
//! histogram approximation).
//!
//! Usage:
//!   loadgen --addr IP:PORT [--mix one|multi|over|distinct] [-n REQUESTS]
//!           [-c CONNECTIONS] [-m STREAMS_PER_CONNECTION] [--threads T]
//!           [--duration SECS] [--keys K] [--key-prefix P]
//!
//! Output: one line, `loadgen: key=value ...`, for run.sh to parse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient, RateLimitRequest,
};
use tonic::transport::{Channel, Endpoint};

struct Args {
    addr: String,
    mix: String,
    requests: u64,
    connections: usize,
    streams: usize,
    threads: usize,
    /// Stop after this long instead of after `requests` (like h2load -D).
    duration: Option<Duration>,
    /// Size of the key space for `distinct`; 0 = every request a new key.
    keys: u64,
    key_prefix: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadgen --addr IP:PORT [--mix one|multi|over|distinct] [-n N] \
         [-c CONNS] [-m STREAMS] [--threads T] [--duration SECS] [--keys K] \
         [--key-prefix P]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    // A fresh prefix per process, so `distinct` never reuses a counter that
    // an earlier run (e.g. the warm-up) created.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut a = Args {
        addr: String::new(),
        mix: "one".into(),
        requests: 200_000,
        connections: 10,
        streams: 10,
        threads: 1,
        duration: None,
        keys: 0,
        key_prefix: format!("{:x}-", nanos & 0xffff_ffff),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<u64>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--addr" => a.addr = val(),
            "--mix" => a.mix = val(),
            "-n" | "--requests" => a.requests = num(val()),
            "-c" | "--connections" => a.connections = num(val()) as usize,
            "-m" | "--streams" => a.streams = num(val()) as usize,
            "--threads" => a.threads = num(val()) as usize,
            "--duration" => {
                let secs = val().parse::<f64>().unwrap_or_else(|_| usage());
                a.duration = Some(Duration::from_secs_f64(secs));
            }
            "--keys" => a.keys = num(val()),
            "--key-prefix" => a.key_prefix = val(),
            _ => usage(),
        }
    }
    if a.duration.is_some() {
        a.requests = u64::MAX; // the deadline, not a count, ends the run
    }
    if a.addr.is_empty() || a.connections == 0 || a.streams == 0 || a.threads == 0 {
        usage();
    }
    if !["one", "multi", "over", "distinct"].contains(&a.mix.as_str()) {
        usage();
    }
    a
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

/// The same mixes as `benches/load/make_body.py`; keep the two in step.
fn request(mix: &str, seq: u64, args: &Args) -> RateLimitRequest {
    let descriptors = match mix {
        "one" => vec![descriptor(&[("api_key", "k1")])],
        "multi" => vec![
            descriptor(&[("api_key", "k1")]),
            descriptor(&[("api_key", "k1"), ("path", "/a")]),
            descriptor(&[("remote_address", "10.0.0.1")]),
            descriptor(&[("tenant", "t1")]),
        ],
        "over" => vec![descriptor(&[("blocked", "yes")])],
        "distinct" => {
            let n = if args.keys == 0 { seq } else { seq % args.keys };
            let key = format!("{}{n}", args.key_prefix);
            vec![descriptor(&[("api_key", &key)])]
        }
        _ => unreachable!(),
    };
    RateLimitRequest {
        domain: "bench".into(),
        descriptors,
        hits_addend: 0,
    }
}

#[derive(Default)]
struct Tally {
    ok: u64,
    over: u64,
    other_code: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.ok += o.ok;
        self.over += o.over;
        self.other_code += o.other_code;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.latencies_us.extend(o.latencies_us);
    }
}

/// One closed-loop stream: take a sequence number, send, wait, repeat.
async fn worker(
    mut client: RateLimitServiceClient<Channel>,
    next: Arc<AtomicU64>,
    args: Arc<Args>,
    deadline: Option<Instant>,
) -> Tally {
    let mut t = Tally::default();
    loop {
        let seq = next.fetch_add(1, Ordering::Relaxed);
        if seq >= args.requests || deadline.is_some_and(|d| Instant::now() >= d) {
            return t;
        }
        // Build the message before starting the clock: we time the server
        // round trip, not our own allocation.
        let req = request(&args.mix, seq, &args);
        let start = Instant::now();
        let res = client.should_rate_limit(req).await;
        let us = start.elapsed().as_micros().min(u32::MAX as u128) as u32;
        t.latencies_us.push(us);
        match res {
            Ok(resp) => match Code::try_from(resp.get_ref().overall_code) {
                Ok(Code::Ok) => t.ok += 1,
                Ok(Code::OverLimit) => t.over += 1,
                _ => t.other_code += 1,
            },
            Err(status) => {
                t.errors += 1;
                if t.first_error.is_none() {
                    t.first_error = Some(format!("{:?}: {}", status.code(), status.message()));
                }
            }
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest-rank: the smallest sample with at least p% of samples <= it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(parse_args());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;

    runtime.block_on(async move {
        // One Channel per connection: a tonic Channel is one HTTP/2
        // connection, and its clones multiplex streams over it (like h2load
        // -c/-m).
        let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let mut channels = Vec::with_capacity(args.connections);
        for _ in 0..args.connections {
            channels.push(endpoint.connect().await?);
        }

        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = args.duration.map(|d| started + d);
        let mut tasks = Vec::new();
        for ch in &channels {
            for _ in 0..args.streams {
                let client = RateLimitServiceClient::new(ch.clone());
                tasks.push(tokio::spawn(worker(
                    client,
                    next.clone(),
                    args.clone(),
                    deadline,
                )));
            }
        }
        let mut total = Tally::default();
        for t in tasks {
            total.merge(t.await?);
        }
        let secs = started.elapsed().as_secs_f64();

        total.latencies_us.sort_unstable();
        let l = &total.latencies_us;
        let mean = l.iter().map(|&x| x as f64).sum::<f64>() / l.len().max(1) as f64;
        println!(
            "loadgen: mix={} requests={} ok={} over={} other_code={} errors={} secs={:.3} \
             rps={:.0} p50_us={} p99_us={} max_us={} mean_us={:.0}",
            args.mix,
            l.len(),
            total.ok,
            total.over,
            total.other_code,
            total.errors,
            secs,
            l.len() as f64 / secs,
            percentile(l, 50.0),
            percentile(l, 99.0),
            l.last().copied().unwrap_or(0),
            mean,
        );
        if let Some(e) = total.first_error {
            eprintln!("loadgen: first error: {e}");
        }
        Ok(())
    })
}
