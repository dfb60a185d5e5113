//! The quota book: every Envoy stream, the buckets it reports, their demand, and each shared
//! limit's split among them. Pure: time is a parameter, and what must be sent comes back as an
//! [`Outbox`] for the caller to deliver.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use fnv::{FnvHashMap, FnvHashSet};

use super::assign::{self, Assignment, REFRESH_AFTER};
use super::bucket::{self, AssignedBy, BucketKey, SharedLimit};
use super::exchange::ReplicaDemands;
use super::share::fair_shares;
use super::stats::BucketShare;
use crate::config::Config;

/// Names one Envoy's stream within this process.
pub type StreamId = u64;

/// Other replicas' demands of a limit are dropped when not refreshed for this long (Redis is
/// unreachable): the limit is then split among this replica's buckets only.
const FLEET_STALE: Duration = Duration::from_secs(15);

/// A bucket unreported this long on an open stream is forgotten (Envoy 1.40 reports every
/// bucket it has every 5 s, idle ones included, so this only happens to a confused client).
const BUCKET_IDLE: Duration = Duration::from_secs(60);

/// One bucket's line of a usage report.
#[derive(Debug, Clone)]
pub struct BucketUsage {
    pub bucket: BucketKey,
    /// Since the bucket's last report; zero on its first (Envoy 1.40 sends 0 there).
    pub elapsed: Duration,
    pub allowed: u64,
    pub denied: u64,
}

/// A bucket within a stream: its domain and its entries. Ordered by domain, then entries
/// (fields in that order).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct StreamBucket {
    domain: String,
    id: BucketKey,
}

/// A bucket in the book: its stream and the bucket within it. Ordered by stream, then bucket
/// (fields in that order): a limit's members are split in this order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct StreamSlot {
    stream: StreamId,
    bucket: StreamBucket,
}

impl StreamSlot {
    fn of(stream: StreamId, bucket: &StreamBucket) -> StreamSlot {
        let bucket = bucket.clone();
        StreamSlot { stream, bucket }
    }
}

/// What to send: per stream, the bucket actions for it.
pub type Outbox = Vec<(StreamId, Vec<BucketAction>)>;

/// A limit's state, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitView {
    pub domain: String,
    pub stat_key: String,
    pub key: String,
    pub requests_per_unit: u32,
    /// Requests per unit asked for by the buckets whose demand is known.
    pub demand: f64,
    /// Tokens per unit in force, per bucket.
    pub shares: Vec<BucketShare>,
}

#[derive(Debug)]
struct Bucket {
    target: AssignedBy,
    /// Requests per unit of its limit, from the last report that covered some time; `None`
    /// until then, which claims an equal split.
    demand: Option<f64>,
    seen_ns: u64,
    assignment: Assignment,
    /// When `assignment` was last sent; `None`: due now.
    sent_ns: Option<u64>,
}

/// One limit shared by the buckets (of any stream) with its counter key.
#[derive(Debug)]
struct Shared {
    limit: SharedLimit,
    /// The share in force, in tokens per unit, of each member; `None` before the first split.
    members: BTreeMap<StreamSlot, Option<u32>>,
    /// The other replicas' demands of this limit (fleet mode), by replica id, and when they
    /// were read.
    remote: Vec<ReplicaDemands>,
    remote_ns: u64,
}

/// Every stream's buckets and every shared limit. Bounded: `max_buckets` over all streams.
#[derive(Debug)]
pub struct Book {
    streams: FnvHashMap<StreamId, HashMap<StreamBucket, Bucket>>,
    limits: HashMap<String, Shared>,
    buckets: usize,
    max_buckets: usize,
    abandons: Vec<StreamSlot>,
    /// Streams with an assignment due (new or changed), so a report looks at those only; the
    /// refreshes are found by the periodic tick, which looks at every bucket.
    pending: FnvHashSet<StreamId>,
    /// This replica's id among those sharing limits through Redis; orders the fleet's buckets
    /// the same way on every replica, so they all round the split alike.
    replica: u64,
    /// `SHADOW_MODE`: no limit refuses, so every bucket is allowed everything.
    global_shadow: bool,
}

impl Book {
    pub fn new(max_buckets: usize) -> Book {
        Book {
            streams: FnvHashMap::default(),
            limits: HashMap::new(),
            buckets: 0,
            max_buckets,
            abandons: Vec::new(),
            pending: FnvHashSet::default(),
            replica: 0,
            global_shadow: false,
        }
    }

    /// The book under `SHADOW_MODE` (`on`): every bucket is assigned allow-all.
    pub fn global_shadow(mut self, on: bool) -> Book {
        self.global_shadow = on;
        self
    }

    /// What a bucket is matched to under `config`.
    fn target(&self, config: &Config, key: &StreamBucket) -> AssignedBy {
        if self.global_shadow {
            return AssignedBy::AllowAll("SHADOW_MODE");
        }
        bucket::resolve(config, &key.domain, &key.id)
    }

    /// The book of replica `id` of a fleet.
    pub fn replica(mut self, id: u64) -> Book {
        self.replica = id;
        self
    }

    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    pub fn buckets(&self) -> usize {
        self.buckets
    }

    pub fn open(&mut self, stream: StreamId) {
        self.streams.entry(stream).or_default();
    }

    /// Takes a report of `stream`; returns what to send, and how many new buckets were
    /// refused because the book is full (Envoy then keeps its `no_assignment_behavior`).
    pub fn report(
        &mut self,
        config: &Config,
        stream: StreamId,
        domain: &str,
        usages: Vec<BucketUsage>,
        now: u64,
    ) -> (Outbox, usize) {
        let mut dirty: BTreeMap<String, bool> = BTreeMap::new();
        let mut full = 0;
        for mut u in usages {
            let slot = StreamBucket {
                domain: domain.to_string(),
                id: std::mem::take(&mut u.bucket),
            };
            let known = self
                .streams
                .get(&stream)
                .is_some_and(|s| s.contains_key(&slot));
            if known {
                self.update(stream, &slot, &u, now, &mut dirty);
            } else if self.buckets < self.max_buckets && self.streams.contains_key(&stream) {
                self.add(config, stream, slot, now, &mut dirty);
            } else {
                full += 1;
            }
        }
        for (key, forced) in dirty {
            self.rebalance(&key, forced);
        }
        (self.flush(now, false), full)
    }

    fn add(
        &mut self,
        config: &Config,
        stream: StreamId,
        key: StreamBucket,
        now: u64,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let target = self.target(config, &key);
        log_target(&key, &target);
        if let AssignedBy::Limit(l) = &target {
            self.join(l, stream, &key);
            dirty.insert(l.key.clone(), true);
        }
        let b = Bucket {
            target,
            demand: None,
            seen_ns: now,
            assignment: Assignment::AllowAll,
            sent_ns: None,
        };
        self.buckets += 1;
        self.pending.insert(stream);
        self.streams.entry(stream).or_default().insert(key, b);
    }

    fn update(
        &mut self,
        stream: StreamId,
        slot: &StreamBucket,
        u: &BucketUsage,
        now: u64,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let Some(b) = self.streams.get_mut(&stream).and_then(|s| s.get_mut(slot)) else {
            return;
        };
        // Envoy 1.40 sends `time_elapsed` in whole seconds, cut down: its 5 s reports often
        // say 4 s, which would overstate demand by a quarter. The time since this bucket's last
        // report, measured here, is the better measure once there is one.
        let since = now.saturating_sub(b.seen_ns) as f64 / 1e9;
        b.seen_ns = now;
        let AssignedBy::Limit(l) = &b.target else {
            return;
        };
        let secs = if since >= 1.0 {
            since
        } else {
            u.elapsed.as_secs_f64()
        };
        if secs > 0.0 {
            let asked = u.allowed.saturating_add(u.denied) as f64;
            b.demand = Some(asked / secs * l.spec.unit_secs as f64);
            dirty.entry(l.key.clone()).or_insert(false);
        }
    }

    fn join(&mut self, l: &SharedLimit, stream: StreamId, key: &StreamBucket) {
        let shared = self.limits.entry(l.key.clone()).or_insert_with(|| Shared {
            limit: l.clone(),
            members: BTreeMap::new(),
            remote: Vec::new(),
            remote_ns: 0,
        });
        // A reload may have changed the limit under the same key: the newest wins.
        shared.limit = l.clone();
        shared.members.insert(StreamSlot::of(stream, key), None);
    }

    /// Takes the bucket out of its limit; the limit's key, to rebalance, if it had one.
    fn leave(
        &mut self,
        stream: StreamId,
        key: &StreamBucket,
        target: &AssignedBy,
    ) -> Option<String> {
        let AssignedBy::Limit(l) = target else {
            return None;
        };
        let shared = self.limits.get_mut(&l.key)?;
        shared.members.remove(&StreamSlot::of(stream, key));
        if shared.members.is_empty() {
            self.limits.remove(&l.key);
            return None;
        }
        Some(l.key.clone())
    }

    /// Splits the limit afresh. The new split is adopted when `forced` (a bucket came or went,
    /// the limit changed) or when some share moved by more than a tenth, so report-to-report
    /// noise in demand does not push every 5 s. Either way the shares in force add up to the
    /// limit.
    fn rebalance(&mut self, limit_key: &str, forced: bool) {
        let Some(shared) = self.limits.get_mut(limit_key) else {
            return;
        };
        let demands: Vec<Option<f64>> = (shared.members.keys())
            .map(|m| {
                let b = self.streams.get(&m.stream).and_then(|s| s.get(&m.bucket));
                b.and_then(|b| b.demand)
            })
            .collect();
        let shares = split(shared, self.replica, &demands);
        let moved = |old: Option<u32>, new: u32| old.is_none_or(|o| o.abs_diff(new) * 10 > o);
        let adopt = forced
            || (shared.members.values())
                .zip(&shares)
                .any(|(&o, &n)| moved(o, n));
        if !adopt {
            return;
        }
        for ((m, in_force), share) in shared.members.iter_mut().zip(shares) {
            *in_force = Some(share);
            let s = &m.stream;
            let Some(b) = self.streams.get_mut(s).and_then(|s| s.get_mut(&m.bucket)) else {
                continue;
            };
            let a = Assignment::of_share(&shared.limit.spec, share);
            if a != b.assignment {
                b.assignment = a;
                b.sent_ns = None;
                self.pending.insert(*s);
            }
        }
    }

    /// The stream ended: its buckets leave their limits, whose other members get its share.
    pub fn close(&mut self, stream: StreamId, now: u64) -> Outbox {
        let Some(buckets) = self.streams.remove(&stream) else {
            return Vec::new();
        };
        self.buckets -= buckets.len();
        let mut dirty = Vec::new();
        for (key, b) in &buckets {
            dirty.extend(self.leave(stream, key, &b.target));
        }
        for key in dirty {
            self.rebalance(&key, true);
        }
        self.flush(now, false)
    }

    /// The periodic work: forgets buckets nobody reports, and sends assignments that are due
    /// (new, changed, not delivered, or to be refreshed before their time to live ends).
    pub fn tick(&mut self, now: u64) -> Outbox {
        let idle = BUCKET_IDLE.as_nanos() as u64;
        let mut gone = Vec::new();
        for (&s, buckets) in &self.streams {
            for (k, b) in buckets {
                if now.saturating_sub(b.seen_ns) >= idle {
                    gone.push((s, k.clone()));
                }
            }
        }
        let mut dirty = self.drop_stale_remotes(now);
        for (s, k) in gone {
            if let Some(b) = self.streams.get_mut(&s).and_then(|m| m.remove(&k)) {
                self.buckets -= 1;
                dirty.extend(self.leave(s, &k, &b.target));
            }
        }
        for key in dirty {
            self.rebalance(&key, true);
        }
        self.flush(now, true)
    }

    /// A new config is live: every bucket is matched again. A bucket whose limit is gone is
    /// abandoned (Envoy forgets it and asks again on its next request); one whose limit changed
    /// gets a new split at once.
    pub fn reconfigure(&mut self, config: &Config, now: u64) -> Outbox {
        let mut moves = Vec::new();
        for (&s, buckets) in &self.streams {
            for (k, b) in buckets {
                let target = self.target(config, k);
                if target != b.target {
                    moves.push((s, k.clone(), target));
                }
            }
        }
        let mut dirty: BTreeMap<String, bool> = BTreeMap::new();
        for (s, k, target) in moves {
            self.retarget(s, k, target, &mut dirty);
        }
        for (key, forced) in dirty {
            self.rebalance(&key, forced);
        }
        self.flush(now, false)
    }

    fn retarget(
        &mut self,
        s: StreamId,
        k: StreamBucket,
        target: AssignedBy,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let Some(old) = self.streams.get(&s).and_then(|m| m.get(&k)) else {
            return;
        };
        let old = old.target.clone();
        dirty.extend(self.leave(s, &k, &old).map(|key| (key, true)));
        let buckets = self.streams.entry(s).or_default();
        match (&old, &target) {
            (AssignedBy::Limit(_), AssignedBy::AllowAll(_) | AssignedBy::Refused(_)) => {
                buckets.remove(&k);
                self.buckets -= 1;
                self.abandons.push(StreamSlot {
                    stream: s,
                    bucket: k,
                });
                return;
            }
            (_, AssignedBy::Limit(l)) => {
                dirty.insert(l.key.clone(), true);
                let l = l.clone();
                self.join(&l, s, &k);
            }
            _ => {}
        }
        if let Some(b) = self.streams.get_mut(&s).and_then(|m| m.get_mut(&k)) {
            log_target(&k, &target);
            if !matches!(target, AssignedBy::Limit(_)) && b.assignment != Assignment::AllowAll {
                b.assignment = Assignment::AllowAll;
                b.sent_ns = None;
                self.pending.insert(s);
            }
            b.target = target;
        }
    }

    /// The stream could not take what was sent: send it again on the next occasion.
    pub fn undelivered(&mut self, stream: StreamId) {
        for b in self
            .streams
            .get_mut(&stream)
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            b.sent_ns = None;
        }
        self.pending.insert(stream);
    }

    /// Collects the actions due now and counts them as sent: in the streams with something
    /// pending, or (`all`, the periodic tick) in every stream, refreshes included.
    fn flush(&mut self, now: u64, all: bool) -> Outbox {
        let refresh = REFRESH_AFTER.as_nanos() as u64;
        let mut out: FnvHashMap<StreamId, Vec<BucketAction>> = FnvHashMap::default();
        for StreamSlot { stream, bucket } in self.abandons.drain(..) {
            (out.entry(stream).or_default()).push(assign::abandon(&bucket.id));
        }
        let which: Vec<StreamId> = if all {
            self.pending.clear();
            self.streams.keys().copied().collect()
        } else {
            self.pending.drain().collect()
        };
        for s in which {
            let Some(buckets) = self.streams.get_mut(&s) else {
                continue;
            };
            for (k, b) in buckets.iter_mut() {
                let due = b.sent_ns.is_none_or(|t| now.saturating_sub(t) >= refresh);
                // A bucket of a limit waits for its first split.
                let split = match &b.target {
                    AssignedBy::Limit(l) => self
                        .limits
                        .get(&l.key)
                        .and_then(|sh| sh.members.get(&StreamSlot::of(s, k)))
                        .is_some_and(Option::is_some),
                    _ => true,
                };
                if due && split {
                    b.sent_ns = Some(now);
                    out.entry(s)
                        .or_default()
                        .push(assign::action(&k.id, b.assignment));
                }
            }
        }
        let mut out: Outbox = out.into_iter().filter(|(_, a)| !a.is_empty()).collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Per shared limit, the demands of this replica's buckets, for the other replicas.
    pub fn local_demands(&self) -> Vec<(String, Vec<Option<f64>>)> {
        let demand = |m: &StreamSlot| {
            let b = self.streams.get(&m.stream).and_then(|s| s.get(&m.bucket));
            b.and_then(|b| b.demand)
        };
        let mut out: Vec<_> = (self.limits.iter())
            .map(|(key, sh)| (key.clone(), sh.members.keys().map(demand).collect()))
            .collect();
        out.sort_by(|a: &(String, Vec<Option<f64>>), b| a.0.cmp(&b.0));
        out
    }

    /// The other replicas' demands of the limit `key`, as just read: the limit is split again
    /// over the whole fleet (at once when a replica's buckets came or went).
    pub fn set_remote(&mut self, key: &str, remote: Vec<ReplicaDemands>, now: u64) -> Outbox {
        let Some(shared) = self.limits.get_mut(key) else {
            return Vec::new();
        };
        let count = |r: &[ReplicaDemands]| r.iter().map(|r| r.demands.len()).sum::<usize>();
        let forced = count(&shared.remote) != count(&remote);
        shared.remote = remote;
        shared.remote_ns = now;
        self.rebalance(key, forced);
        self.flush(now, false)
    }

    /// Drops other replicas' demands not refreshed for [`FLEET_STALE`]; the keys to rebalance.
    fn drop_stale_remotes(&mut self, now: u64) -> Vec<String> {
        let stale = FLEET_STALE.as_nanos() as u64;
        let mut out = Vec::new();
        for (key, sh) in &mut self.limits {
            if !sh.remote.is_empty() && now.saturating_sub(sh.remote_ns) >= stale {
                sh.remote.clear();
                out.push(key.clone());
            }
        }
        out
    }

    /// Every shared limit, sorted by counter key, for metrics.
    pub fn view(&self) -> Vec<LimitView> {
        let mut out: Vec<LimitView> = (self.limits.values())
            .map(|sh| {
                let mut demand = 0.0;
                let mut shares = Vec::with_capacity(sh.members.len());
                for (m, share) in &sh.members {
                    let b = self.streams.get(&m.stream).and_then(|s| s.get(&m.bucket));
                    demand += b.and_then(|b| b.demand).unwrap_or(0.0);
                    let (stream, share) = (m.stream, share.unwrap_or(0));
                    shares.push(BucketShare { stream, share });
                }
                LimitView {
                    domain: sh.limit.domain.clone(),
                    stat_key: sh.limit.stat_key.clone(),
                    key: sh.limit.key.clone(),
                    requests_per_unit: sh.limit.spec.requests_per_unit,
                    demand,
                    shares,
                }
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// This replica's buckets' shares of the limit: the fleet's buckets (this replica's and the
/// others', ordered by replica id) split together, this replica's part taken out.
fn split(shared: &Shared, me: u64, mine: &[Option<f64>]) -> Vec<u32> {
    let rpu = shared.limit.spec.requests_per_unit;
    if shared.remote.is_empty() {
        return fair_shares(rpu, mine);
    }
    let mut all: Vec<(u64, &[Option<f64>])> = (shared.remote.iter())
        .filter(|r| r.replica != me)
        .map(|r| (r.replica, r.demands.as_slice()))
        .collect();
    all.push((me, mine));
    all.sort_by_key(|(id, _)| *id);
    let at: usize = all
        .iter()
        .take_while(|(id, _)| *id != me)
        .map(|(_, d)| d.len())
        .sum();
    let flat: Vec<Option<f64>> = all.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    fair_shares(rpu, &flat)[at..at + mine.len()].to_vec()
}

fn log_target(StreamBucket { domain, id: key }: &StreamBucket, target: &AssignedBy) {
    match target {
        AssignedBy::Limit(l) => {
            tracing::debug!(domain, bucket = ?key, limit = %l.stat_key, "RLQS bucket shares a limit")
        }
        AssignedBy::AllowAll(why) => {
            tracing::debug!(domain, bucket = ?key, why, "RLQS bucket allowed all")
        }
        AssignedBy::Refused(why) => {
            // The bucket id's values are the client's: a digest at error level.
            let bucket: Vec<(&str, String)> = (key.iter())
                .map(|(k, v)| (k.as_str(), crate::telemetry::digest(v)))
                .collect();
            tracing::error!(domain, bucket = ?bucket, error = %why, "RLQS bucket refused")
        }
    }
}

#[cfg(test)]
mod tests;
