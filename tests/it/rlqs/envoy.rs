//! RLQS with real Envoy 1.40 processes running examples/envoy/envoy-rlqs.yaml (the
//! `rate_limit_quota` filter, buckets by the `x-user` header): Envoys enforce token buckets
//! locally and turnstile shares each limit among them.
//!
//! Tolerances. A share of N per second is a token bucket refilled with N every second and
//! holding N, so over any T whole seconds an Envoy that keeps asking for more admits between
//! N·(T−1) (its bucket empty at the start) and N·(T+1) (full at the start). Envoy reports every
//! 5 s, so turnstile learns of a change in demand up to 5 s late: the windows measured below
//! start after the report that follows each change. A share changed by a push keeps the
//! bucket's current level (Envoy 1.40 does not refill on a new assignment), so a fleet admits at
//! most N·(T+1) in T seconds plus, across one change, the old capacity of the Envoy that lost
//! share; the windows below start after the changes settle.

use std::time::{Duration, Instant};

use crate::common::rlqs::{Fleet, Load};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Asserts `admitted` in `t` seconds fits a token bucket of `n` a second, given what was sent.
fn assert_rate(what: &str, admitted: u64, sent: u64, n: u64, t: u64) {
    eprintln!("{what}: {admitted} admitted of {sent} sent in {t} s (bucket {n}/s)");
    assert!(
        admitted <= n * (t + 1),
        "{what}: {admitted} admitted in {t} s, more than a bucket of {n}/s allows ({})",
        n * (t + 1)
    );
    // Below N·(T−1) only if fewer were sent (a starved load generator on a busy machine).
    let floor = (n * (t - 1)).min(sent.saturating_sub(n));
    assert!(
        admitted >= floor,
        "{what}: {admitted} admitted in {t} s of {sent} sent, fewer than a bucket of {n}/s gives ({floor})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_envoy_over_its_limit_converges_to_the_limit() {
    // The shipped example as it is: 20 per second per user.
    let fleet = Fleet::shipped("one");
    let envoy = fleet.envoy("envoy").await;
    let epoch = Instant::now();
    let load = Load::start(&envoy, "alice", 50, epoch);
    // The first assignment arrives some 50 ms after the first request (the whole limit: one
    // Envoy, nobody to share with), so no report interval needs to pass.
    load.until(secs(9)).await;
    let (admitted, refused, sent) = load.count(secs(1), secs(9));
    assert_rate("one Envoy", admitted, sent, 20, 8);
    assert!(refused > 0, "50/s against 20/s: some must be refused (429)");
    // The assignment lives 30 s in Envoy; turnstile sends it again every 15 s, so it still
    // holds after its first 30 s are over (expired, Envoy would fall back to allow-all).
    load.until(secs(37)).await;
    load.stop();
    let (admitted, _, sent) = load.count(secs(31), secs(37));
    assert_rate(
        "one Envoy, past the first time to live",
        admitted,
        sent,
        20,
        6,
    );
    let m = fleet.metrics().await;
    assert!(m.contains("ratelimit_service_rlqs_streams 1"), "{m}");
    assert!(
        m.contains("ratelimit_service_rlqs_limit_share{domain=\"quota\",key=\"quota_user_alice_\",stream=\"1\"} 20"),
        "{m}"
    );
}

const SHARED: &str = "
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 20}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_one_limit_max_min_fairly_and_the_survivor_gets_it_all() {
    let fleet = Fleet::start("two", SHARED);
    let big = fleet.envoy("big").await;
    let mut small = Some(fleet.envoy("small").await);
    let epoch = Instant::now();
    let big_load = Load::start(&big, "shared", 30, epoch);
    load_until(&big_load, 2).await;
    // The second Envoy asks for 6/s: its first report (demand unknown) gets it half, its next
    // report (5 s later) its demand; the other gets the rest, 14/s.
    let small_load = Load::start(small.as_ref().unwrap(), "shared", 6, epoch);
    load_until(&big_load, 19).await;
    let (big_in, _, big_sent) = big_load.count(secs(9), secs(19));
    let (small_in, small_out, small_sent) = small_load.count(secs(9), secs(19));
    assert_rate("the big Envoy's share", big_in, big_sent, 14, 10);
    eprintln!("the small Envoy: {small_in} admitted, {small_out} refused of {small_sent}");
    assert!(
        small_in * 10 >= small_sent * 9,
        "the small Envoy got {small_in} of its {small_sent} ({small_out} refused): \
         max-min fairness owes it its whole demand"
    );
    assert!(
        big_in + small_in <= 20 * 11,
        "{big_in} + {small_in} admitted in 10 s: more than the limit allows (20·11)"
    );
    let m = fleet.metrics().await;
    assert!(m.contains("ratelimit_service_rlqs_streams 2"), "{m}");
    let shares = shares(&m, "quota_user_shared_");
    assert_eq!(shares.len(), 2, "{m}");
    assert_eq!(
        shares.iter().sum::<u64>(),
        20,
        "shares add up to the limit: {m}"
    );
    assert!(
        (5..=8).contains(&shares[1]),
        "the small Envoy's share is its demand: {m}"
    );

    // One Envoy stops: its stream ends, and its share goes back at once.
    small_load.stop();
    drop(small.take());
    load_until(&big_load, 27).await;
    big_load.stop();
    let (big_in, _, big_sent) = big_load.count(secs(21), secs(27));
    assert_rate("the survivor", big_in, big_sent, 20, 6);
}

/// The shares of the limit with counter key `key` in the metrics, by stream.
fn shares(metrics: &str, key: &str) -> Vec<u64> {
    let prefix = format!("ratelimit_service_rlqs_limit_share{{domain=\"quota\",key=\"{key}\",");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect()
}

async fn load_until(load: &Load, s: u64) {
    load.until(secs(s)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lowers_the_limit_reaches_the_envoy_and_one_that_removes_it_frees_it() {
    let fleet = Fleet::start(
        "reload",
        "domain: quota\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 12}\n",
    );
    let envoy = fleet.envoy("envoy").await;
    let epoch = Instant::now();
    let load = Load::start(&envoy, "r", 30, epoch);
    load.until(secs(6)).await;
    let (before, _, sent) = load.count(secs(1), secs(6));
    assert_rate("before the reload", before, sent, 12, 5);
    fleet.reload(
        "domain: quota\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 4}\n",
    );
    // turnstile matches the buckets again within a second and pushes the new share at once;
    // no report needs to pass.
    load.until(secs(14)).await;
    let (after, _, sent) = load.count(secs(8), secs(14));
    assert_rate("after the reload", after, sent, 4, 6);
    // The limit goes away: turnstile abandons the bucket, Envoy asks again on its next request
    // and is told to allow all.
    fleet.reload("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    load.until(secs(21)).await;
    load.stop();
    let (admitted, refused, sent) = load.count(secs(17), secs(21));
    eprintln!("limit removed: {admitted} admitted, {refused} refused of {sent}");
    assert_eq!(
        refused, 0,
        "no limit left, nothing refused ({admitted} of {sent} admitted)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_split_one_limit_over_both_their_envoys() {
    let redis = crate::common::redis::Redis::start();
    let env = crate::common::redis::env(&redis, "rlqs-envoy:");
    // Two turnstile replicas, one Envoy each: the limit holds over both.
    let one = Fleet::start_with("replica-one", SHARED, &env);
    let two = Fleet::start_with("replica-two", SHARED, &env);
    let big = one.envoy("big").await;
    let small = two.envoy("small").await;
    let epoch = Instant::now();
    let big_load = Load::start(&big, "shared", 30, epoch);
    load_until(&big_load, 2).await;
    let small_load = Load::start(&small, "shared", 6, epoch);
    // As with one replica, plus up to a second for the demands to cross Redis.
    load_until(&big_load, 20).await;
    big_load.stop();
    small_load.stop();
    let (big_in, _, big_sent) = big_load.count(secs(10), secs(20));
    let (small_in, small_out, small_sent) = small_load.count(secs(10), secs(20));
    assert_rate(
        "the big Envoy's share across replicas",
        big_in,
        big_sent,
        14,
        10,
    );
    eprintln!("the small Envoy: {small_in} admitted, {small_out} refused of {small_sent}");
    assert!(
        small_in * 10 >= small_sent * 9,
        "the small Envoy got {small_in} of its {small_sent} ({small_out} refused)"
    );
    assert!(
        big_in + small_in <= 20 * 11,
        "{big_in} + {small_in} admitted in 10 s over two replicas: more than 20·11"
    );
}
