//! The load side of `scripts/soak.sh`: sustained mixed traffic against a running turnstile, with
//! its own tally, checked at the end.
//!
//! Traffic, all in domain `soak` (the config is in `scripts/soak.sh`):
//! - normal: closed-loop lanes on a few `normal` keys (limit 1000/s each: mostly OK);
//! - flood: closed-loop lanes sending a new `flood` value on every call (limit 5/s), so the
//!   server sees a new counter key per call and must forget them as their windows end;
//! - sampled: `minute` keys (limit 600/min) and `second` keys (limit 20/s), each called on a
//!   fixed schedule faster than its limit, open loop, so every window runs out;
//! - bad: requests over the request limits, or malformed, which must get INVALID_ARGUMENT
//!   (INVALID_ARGUMENT, the one over the message size too: tonic's decoder refuses it and the
//!   server answers it as the bad input it is).
//!
//! Checks, printed as `soak-check:` lines, any failure makes the exit code 1:
//! - no call failed other than a bad request refused as expected, or RESOURCE_EXHAUSTED (shed);
//! - exact counts on the sampled keys: in every window the OK answers carry the remaining counts
//!   N-1, N-2, …, N-k, each once (no hit counted twice or lost); in every window entirely inside
//!   the run where the limit was reached, k is exactly N.
//!
//! A response is placed in its window without trusting the client's timing: for minute keys by
//! `duration_until_reset` (the window's end, to the second); for second keys only when the call
//! was sent and answered within the same second, so they are sent only in a second's first nine
//! tenths (windows an answer could not be placed in are left out and counted).
//!
//! Usage: soak_client --addr HOST:PORT --seconds S [--lanes N] [--connections C]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use tonic::Code;

const MINUTE_LIMIT: u32 = 600;
const SECOND_LIMIT: u32 = 20;
const SAMPLED_KEYS: usize = 2;
/// Calls per second on each sampled key: well over both limits (600/min is 10/s).
const SAMPLE_RATE: u64 = 40;
const NORMAL_KEYS: usize = 5;

const OK: i32 = 1;
const OVER: i32 = 2;

struct Args {
    addr: String,
    seconds: u64,
    lanes: usize,
    connections: usize,
}

fn args() -> Args {
    let mut a = Args {
        addr: String::new(),
        seconds: 120,
        lanes: 8,
        connections: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--addr" => a.addr = value(),
            "--seconds" => a.seconds = value().parse().unwrap_or_else(|_| usage("--seconds")),
            "--lanes" => a.lanes = value().parse().unwrap_or_else(|_| usage("--lanes")),
            "--connections" => {
                a.connections = value().parse().unwrap_or_else(|_| usage("--connections"))
            }
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if a.addr.is_empty() {
        usage("--addr is required");
    }
    a
}

fn usage(why: &str) -> ! {
    eprintln!("soak_client: {why}\nusage: soak_client --addr HOST:PORT --seconds S [--lanes N] [--connections C]");
    std::process::exit(2)
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

fn request(pairs: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "soak".into(),
        descriptors: vec![descriptor(pairs)],
        hits_addend: 0,
    }
}

fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// Counts of every kind of answer.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    over: AtomicU64,
    shed: AtomicU64,
    bad_refused: AtomicU64,
    oversized_refused: AtomicU64,
    /// Calls of the key flood: each one a counter key the server had never seen.
    flood_keys: AtomicU64,
    /// Anything else: each one is also printed.
    errors: AtomicU64,
}

impl Tally {
    fn answer(&self, r: &Result<RateLimitResponse, tonic::Status>, what: &str) {
        match r {
            Ok(resp) if resp.overall_code == OK => self.ok.fetch_add(1, Ordering::Relaxed),
            Ok(resp) if resp.overall_code == OVER => self.over.fetch_add(1, Ordering::Relaxed),
            Ok(resp) => self.error(format!("{what}: overall code {}", resp.overall_code)),
            Err(s) if s.code() == Code::ResourceExhausted => {
                self.shed.fetch_add(1, Ordering::Relaxed)
            }
            Err(s) => self.error(format!("{what}: {s:?}")),
        };
    }

    fn error(&self, message: String) -> u64 {
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 20 {
            eprintln!("soak-error: {message}");
        }
        n
    }
}

/// One sampled answer: the window it was counted in (or the two it may have been counted in),
/// OK or not, and the remaining count.
struct Sample {
    window: Result<u64, (u64, u64)>,
    ok: bool,
    remaining: u32,
}

type Samples = Arc<Mutex<HashMap<String, Vec<Sample>>>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let mut clients = Vec::with_capacity(a.connections);
    for _ in 0..a.connections.max(1) {
        let c = RateLimitServiceClient::connect(format!("http://{}", a.addr))
            .await
            .unwrap_or_else(|e| usage(&format!("cannot connect to {}: {e}", a.addr)));
        clients.push(c.max_decoding_message_size(usize::MAX));
    }
    let client = |i: usize| clients[i % clients.len()].clone();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Samples = Arc::default();
    let started = now_s();
    let mut tasks = tokio::task::JoinSet::new();

    for lane in 0..a.lanes {
        tasks.spawn(normal(client(lane), lane, tally.clone(), stop.clone()));
        tasks.spawn(flood(client(lane + 1), lane, tally.clone(), stop.clone()));
    }
    for lane in 0..2 {
        tasks.spawn(bad(client(lane + 2), lane, tally.clone(), stop.clone()));
    }
    for k in 0..SAMPLED_KEYS {
        for unit in ["minute", "second"] {
            tasks.spawn(sampled(
                client(k + 3),
                unit,
                format!("{unit}-{k}"),
                tally.clone(),
                samples.clone(),
                stop.clone(),
            ));
        }
    }

    let mut last = 0u64;
    for s in 1..=a.seconds {
        tokio::time::sleep_until(
            tokio::time::Instant::now()
                + Duration::from_secs_f64((started + s as f64 - now_s()).max(0.0)),
        )
        .await;
        if s % 10 == 0 {
            let done = tally.ok.load(Ordering::Relaxed) + tally.over.load(Ordering::Relaxed);
            eprintln!(
                "soak-progress: t={s}s calls/s={} shed={} errors={}",
                (done - last) / 10,
                tally.shed.load(Ordering::Relaxed),
                tally.errors.load(Ordering::Relaxed)
            );
            last = done;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let ended = now_s();
    while tasks.join_next().await.is_some() {}

    let t = &tally;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "soak-tally: seconds={:.0} calls/s={:.0} ok={} over_limit={} shed={} flood_keys={} bad_refused={} oversized_refused={} errors={}",
        ended - started,
        (load(&t.ok) + load(&t.over) + load(&t.shed) + load(&t.bad_refused)) as f64
            / (ended - started),
        load(&t.ok),
        load(&t.over),
        load(&t.shed),
        load(&t.flood_keys),
        load(&t.bad_refused),
        load(&t.oversized_refused),
        load(&t.errors)
    );
    let mut failed = false;
    let mut check = |ok: bool, line: String| {
        println!("soak-check: {} {line}", if ok { "PASS" } else { "FAIL" });
        failed |= !ok;
    };
    check(
        load(&t.errors) == 0,
        format!(
            "errors other than INVALID_ARGUMENT (bad and oversized requests) and RESOURCE_EXHAUSTED (shed): {}",
            load(&t.errors)
        ),
    );
    check(
        load(&t.bad_refused) > 0 && load(&t.ok) > 0,
        "traffic of every kind was answered".into(),
    );
    let samples = samples.lock().expect("no task panicked holding it");
    let mut keys: Vec<&String> = samples.keys().collect();
    keys.sort();
    for key in keys {
        let (limit, window_s) = if key.starts_with("minute") {
            (MINUTE_LIMIT, 60)
        } else {
            (SECOND_LIMIT, 1)
        };
        let (ok, line) = exact(&samples[key], limit, window_s, started, ended);
        check(
            ok,
            format!("exact counts on {key} (limit {limit}/{window_s}s): {line}"),
        );
    }
    std::process::exit(if failed { 1 } else { 0 });
}

/// Checks one sampled key's windows: see the module comment.
fn exact(
    samples: &[Sample],
    limit: u32,
    window_s: u64,
    started: f64,
    ended: f64,
) -> (bool, String) {
    // window → (remaining counts of OK answers, whether the limit was reached)
    let mut windows: BTreeMap<u64, (Vec<u32>, bool)> = BTreeMap::new();
    // An OK that could not be placed spoils the counts of both windows it may belong to.
    let mut spoiled = std::collections::BTreeSet::new();
    let mut unplaced = 0;
    for s in samples {
        match s.window {
            Ok(w) => {
                let e = windows.entry(w).or_default();
                if s.ok {
                    e.0.push(s.remaining);
                } else {
                    e.1 = true;
                }
            }
            Err((a, b)) => {
                unplaced += 1;
                if s.ok {
                    spoiled.extend(a..=b);
                }
            }
        }
    }
    let mut full = 0;
    let mut partial = 0;
    let mut bad = Vec::new();
    for (w, (mut rem, reached)) in windows {
        if spoiled.contains(&w) {
            continue;
        }
        rem.sort_unstable_by(|a, b| b.cmp(a));
        let k = rem.len() as u32;
        let expected: Vec<u32> = (0..k).map(|i| limit - 1 - i).collect();
        let start = (w * window_s) as f64;
        let inside = start >= started && start + window_s as f64 <= ended;
        if rem != expected {
            bad.push(format!("window {w}: remaining {rem:?}"));
        } else if inside && reached {
            full += 1;
            if k != limit {
                bad.push(format!("window {w}: {k} OK of {limit}"));
            }
        } else {
            partial += 1;
        }
    }
    let line = format!(
        "{full} full windows with exactly {limit} OK, {partial} partial windows consistent, \
         {unplaced} answers not placed ({} windows left out){}",
        spoiled.len(),
        if bad.is_empty() {
            String::new()
        } else {
            format!("; wrong: {}", bad.join("; "))
        }
    );
    // A run shorter than two windows may hold no whole window: then consistency is the check.
    let could_fill = ended - started >= 2.0 * window_s as f64;
    (bad.is_empty() && (full > 0 || !could_fill), line)
}

async fn normal(
    mut c: RateLimitServiceClient<Channel>,
    lane: usize,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut n = lane;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("n{}", n % NORMAL_KEYS);
        n += 1;
        let r = c
            .should_rate_limit(request(&[("normal", &key)]))
            .await
            .map(|r| r.into_inner());
        tally.answer(&r, "normal");
    }
}

async fn flood(
    mut c: RateLimitServiceClient<Channel>,
    lane: usize,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let value = format!("f{lane}-{n}");
        n += 1;
        tally.flood_keys.fetch_add(1, Ordering::Relaxed);
        let r = c
            .should_rate_limit(request(&[("flood", &value)]))
            .await
            .map(|r| r.into_inner());
        tally.answer(&r, "flood");
    }
}

/// Requests that must be refused, each over one request limit or malformed: the request, the
/// code it must get, and whether it is the oversized one.
fn bad_request(n: u64) -> (RateLimitRequest, Code, bool) {
    let r = match n % 7 {
        0 => request(&[("normal", &"v".repeat(4097))]),
        1 => request(&[(&"k".repeat(257), "v")]),
        2 => RateLimitRequest {
            domain: "soak".into(),
            descriptors: (0..65).map(|_| descriptor(&[("normal", "n0")])).collect(),
            hits_addend: 0,
        },
        3 => {
            let pairs: Vec<(String, String)> =
                (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            request(&refs)
        }
        4 => request(&[("", "v")]),
        5 => RateLimitRequest {
            domain: String::new(),
            ..request(&[("normal", "n0")])
        },
        // Over the 1 MiB message size; rarely, as it is a megabyte each time.
        _ if n % 70 == 6 => {
            return (
                RateLimitRequest {
                    domain: "d".repeat(1 << 20),
                    ..request(&[("normal", "n0")])
                },
                Code::InvalidArgument,
                true,
            )
        }
        _ => RateLimitRequest {
            descriptors: vec![],
            ..request(&[])
        },
    };
    (r, Code::InvalidArgument, false)
}

async fn bad(
    mut c: RateLimitServiceClient<Channel>,
    lane: usize,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut n = lane as u64;
    while !stop.load(Ordering::Relaxed) {
        let (r, expected, oversized) = bad_request(n);
        n += 2;
        match c.should_rate_limit(r).await {
            Err(s) if s.code() == expected && oversized => {
                tally.oversized_refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(s) if s.code() == expected => {
                tally.bad_refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(s) if s.code() == Code::ResourceExhausted => {
                tally.shed.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                tally.error(format!(
                    "bad request {n}: expected {expected:?}, got {other:?}"
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Calls `key` SAMPLE_RATE times a second, each call its own task (open loop: a slow answer does
/// not slow the schedule), recording where each answer was counted.
async fn sampled(
    c: RateLimitServiceClient<Channel>,
    unit: &'static str,
    value: String,
    tally: Arc<Tally>,
    samples: Samples,
    stop: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / SAMPLE_RATE));
    let mut inflight = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        // A second key's answer is placed only when it came in the second it was sent in; a call
        // sent in a second's last tenth would often cross into the next one on a loaded machine
        // and spoil both windows (a CI run left every window out). The first nine tenths still
        // send 36 calls against the limit of 20.
        if unit == "second" && now_s().fract() > 0.9 {
            continue;
        }
        let mut c = c.clone();
        let value = value.clone();
        let tally = tally.clone();
        let samples = samples.clone();
        inflight.spawn(async move {
            let sent = now_s();
            let r = c
                .should_rate_limit(request(&[(unit, &value)]))
                .await
                .map(|r| r.into_inner());
            let answered = now_s();
            tally.answer(&r, unit);
            let Ok(resp) = r else { return };
            let Some(status) = resp.statuses.first() else {
                tally.error(format!("{unit} {value}: no status"));
                return;
            };
            let window = if unit == "minute" {
                // The window ends `reset` (rounded up to a second) after the server's decision,
                // which came between `sent` and `answered`: the nearest minute to sent + reset.
                let reset = status
                    .duration_until_reset
                    .as_ref()
                    .map_or(0, |d| d.seconds as u64);
                let end = ((sent + reset as f64) / 60.0).round() as u64;
                Ok(end - 1)
            } else if sent.floor() == answered.floor() {
                Ok(sent.floor() as u64)
            } else {
                Err((sent.floor() as u64, answered.floor() as u64))
            };
            samples
                .lock()
                .expect("no task panicked holding it")
                .entry(value)
                .or_default()
                .push(Sample {
                    window,
                    ok: resp.overall_code == OK,
                    remaining: status.limit_remaining,
                });
        });
        while inflight.try_join_next().is_some() {}
    }
    while inflight.join_next().await.is_some() {}
}
