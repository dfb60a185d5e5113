//! The quota book: every Envoy stream, the buckets it reports, their demand, and each shared
//! limit's split among them. Pure: time is a parameter, and what must be sent comes back as an
//! [`Outbox`] for the caller to deliver.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use fnv::FnvHashMap;

use super::assign::{self, Assignment, REFRESH_AFTER};
use super::bucket::{self, BucketKey, LimitRef, Target};
use super::share::fair_shares;
use crate::config::Config;

/// Names one Envoy's stream within this process.
pub type StreamId = u64;

/// A bucket unreported this long on an open stream is forgotten (Envoy 1.40 reports every
/// bucket it has every 5 s, idle ones included, so this only happens to a confused client).
const BUCKET_IDLE: Duration = Duration::from_secs(60);

/// One bucket's line of a usage report.
#[derive(Debug, Clone)]
pub struct Usage {
    pub bucket: BucketKey,
    /// Since the bucket's last report; zero on its first (Envoy 1.40 sends 0 there).
    pub elapsed: Duration,
    pub allowed: u64,
    pub denied: u64,
}

/// A bucket within a stream: its domain and its entries.
type Slot = (String, BucketKey);

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
    /// Tokens per unit in force, per (stream, bucket).
    pub shares: Vec<(StreamId, u32)>,
}

#[derive(Debug)]
struct Bucket {
    target: Target,
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
    limit: LimitRef,
    /// The share in force, in tokens per unit, of each member; `None` before the first split.
    members: BTreeMap<(StreamId, Slot), Option<u32>>,
}

/// Every stream's buckets and every shared limit. Bounded: `max_buckets` over all streams.
#[derive(Debug)]
pub struct Book {
    streams: FnvHashMap<StreamId, HashMap<Slot, Bucket>>,
    limits: HashMap<String, Shared>,
    buckets: usize,
    max_buckets: usize,
    abandons: Vec<(StreamId, Slot)>,
}

impl Book {
    pub fn new(max_buckets: usize) -> Book {
        Book {
            streams: FnvHashMap::default(),
            limits: HashMap::new(),
            buckets: 0,
            max_buckets,
            abandons: Vec::new(),
        }
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
        usages: Vec<Usage>,
        now: u64,
    ) -> (Outbox, usize) {
        let mut dirty: BTreeMap<String, bool> = BTreeMap::new();
        let mut full = 0;
        for mut u in usages {
            let slot = (domain.to_string(), std::mem::take(&mut u.bucket));
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
        (self.flush(now), full)
    }

    fn add(
        &mut self,
        config: &Config,
        stream: StreamId,
        key: Slot,
        now: u64,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let target = bucket::resolve(config, &key.0, &key.1);
        log_target(&key, &target);
        if let Target::Limit(l) = &target {
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
        self.streams.entry(stream).or_default().insert(key, b);
    }

    fn update(
        &mut self,
        stream: StreamId,
        slot: &Slot,
        u: &Usage,
        now: u64,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let Some(b) = self.streams.get_mut(&stream).and_then(|s| s.get_mut(slot)) else {
            return;
        };
        b.seen_ns = now;
        let Target::Limit(l) = &b.target else {
            return;
        };
        let secs = u.elapsed.as_secs_f64();
        if secs > 0.0 {
            let asked = u.allowed.saturating_add(u.denied) as f64;
            b.demand = Some(asked / secs * l.spec.unit_secs as f64);
            dirty.entry(l.key.clone()).or_insert(false);
        }
    }

    fn join(&mut self, l: &LimitRef, stream: StreamId, key: &Slot) {
        let shared = self.limits.entry(l.key.clone()).or_insert_with(|| Shared {
            limit: l.clone(),
            members: BTreeMap::new(),
        });
        // A reload may have changed the limit under the same key: the newest wins.
        shared.limit = l.clone();
        shared.members.insert((stream, key.clone()), None);
    }

    /// Takes the bucket out of its limit; the limit's key, to rebalance, if it had one.
    fn leave(&mut self, stream: StreamId, key: &Slot, target: &Target) -> Option<String> {
        let Target::Limit(l) = target else {
            return None;
        };
        let shared = self.limits.get_mut(&l.key)?;
        shared.members.remove(&(stream, key.clone()));
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
            .map(|(s, k)| {
                let b = self.streams.get(s).and_then(|s| s.get(k));
                b.and_then(|b| b.demand)
            })
            .collect();
        let shares = fair_shares(shared.limit.spec.requests_per_unit, &demands);
        let moved = |old: Option<u32>, new: u32| old.is_none_or(|o| o.abs_diff(new) * 10 > o);
        let adopt = forced
            || (shared.members.values())
                .zip(&shares)
                .any(|(&o, &n)| moved(o, n));
        if !adopt {
            return;
        }
        for (((s, k), in_force), share) in shared.members.iter_mut().zip(shares) {
            *in_force = Some(share);
            let Some(b) = self.streams.get_mut(s).and_then(|s| s.get_mut(k)) else {
                continue;
            };
            let a = Assignment::of_share(&shared.limit.spec, share);
            if a != b.assignment {
                b.assignment = a;
                b.sent_ns = None;
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
        self.flush(now)
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
        let mut dirty = Vec::new();
        for (s, k) in gone {
            if let Some(b) = self.streams.get_mut(&s).and_then(|m| m.remove(&k)) {
                self.buckets -= 1;
                dirty.extend(self.leave(s, &k, &b.target));
            }
        }
        for key in dirty {
            self.rebalance(&key, true);
        }
        self.flush(now)
    }

    /// A new config is live: every bucket is matched again. A bucket whose limit is gone is
    /// abandoned (Envoy forgets it and asks again on its next request); one whose limit changed
    /// gets a new split at once.
    pub fn reconfigure(&mut self, config: &Config, now: u64) -> Outbox {
        let mut moves = Vec::new();
        for (&s, buckets) in &self.streams {
            for (k, b) in buckets {
                let target = bucket::resolve(config, &k.0, &k.1);
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
        self.flush(now)
    }

    fn retarget(
        &mut self,
        s: StreamId,
        k: Slot,
        target: Target,
        dirty: &mut BTreeMap<String, bool>,
    ) {
        let Some(old) = self.streams.get(&s).and_then(|m| m.get(&k)) else {
            return;
        };
        let old = old.target.clone();
        dirty.extend(self.leave(s, &k, &old).map(|key| (key, true)));
        let buckets = self.streams.entry(s).or_default();
        match (&old, &target) {
            (Target::Limit(_), Target::AllowAll(_) | Target::Refused(_)) => {
                buckets.remove(&k);
                self.buckets -= 1;
                self.abandons.push((s, k));
                return;
            }
            (_, Target::Limit(l)) => {
                dirty.insert(l.key.clone(), true);
                let l = l.clone();
                self.join(&l, s, &k);
            }
            _ => {}
        }
        if let Some(b) = self.streams.get_mut(&s).and_then(|m| m.get_mut(&k)) {
            log_target(&k, &target);
            if !matches!(target, Target::Limit(_)) && b.assignment != Assignment::AllowAll {
                b.assignment = Assignment::AllowAll;
                b.sent_ns = None;
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
    }

    /// Collects the actions due now and counts them as sent.
    fn flush(&mut self, now: u64) -> Outbox {
        let refresh = REFRESH_AFTER.as_nanos() as u64;
        let mut out: FnvHashMap<StreamId, Vec<BucketAction>> = FnvHashMap::default();
        for (s, k) in self.abandons.drain(..) {
            out.entry(s).or_default().push(assign::abandon(&k.1));
        }
        for (&s, buckets) in &mut self.streams {
            for (k, b) in buckets.iter_mut() {
                let due = b.sent_ns.is_none_or(|t| now.saturating_sub(t) >= refresh);
                // A bucket of a limit waits for its first split.
                let split = match &b.target {
                    Target::Limit(l) => self
                        .limits
                        .get(&l.key)
                        .and_then(|sh| sh.members.get(&(s, k.clone())))
                        .is_some_and(Option::is_some),
                    _ => true,
                };
                if due && split {
                    b.sent_ns = Some(now);
                    out.entry(s)
                        .or_default()
                        .push(assign::action(&k.1, b.assignment));
                }
            }
        }
        let mut out: Outbox = out.into_iter().filter(|(_, a)| !a.is_empty()).collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Every shared limit, sorted by counter key, for metrics.
    pub fn view(&self) -> Vec<LimitView> {
        let mut out: Vec<LimitView> = (self.limits.values())
            .map(|sh| {
                let mut demand = 0.0;
                let mut shares = Vec::with_capacity(sh.members.len());
                for ((s, k), share) in &sh.members {
                    let b = self.streams.get(s).and_then(|m| m.get(k));
                    demand += b.and_then(|b| b.demand).unwrap_or(0.0);
                    shares.push((*s, share.unwrap_or(0)));
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

fn log_target((domain, key): &Slot, target: &Target) {
    match target {
        Target::Limit(l) => {
            tracing::debug!(domain, bucket = ?key, limit = %l.stat_key, "RLQS bucket shares a limit")
        }
        Target::AllowAll(why) => {
            tracing::debug!(domain, bucket = ?key, why, "RLQS bucket allowed all")
        }
        Target::Refused(why) => {
            tracing::error!(domain, bucket = ?key, error = %why, "RLQS bucket refused")
        }
    }
}

#[cfg(test)]
mod tests;
