//! The process-wide quota handle: one [`Book`] behind a mutex (never held across an await)
//! for the RLQS streams of every worker, since one Envoy's stream lands on one worker but a
//! limit is shared by all. Delivers what the book decides, notices new configs, keeps metrics.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use fnv::FnvHashMap;
use tokio::sync::mpsc;

use super::book::{Book, BucketUsage, Outbox, StreamId};
use super::bucket::{bucket_key, MAX_BUCKET_ENTRIES};
use super::exchange::{DemandExchange, ReplicaDemands};
use super::stats::{QuotaLimit, RlqsStats};
use crate::limiter::Clock;
use crate::service::{Live, LiveLimits};

/// Streams open at once; more are refused (RESOURCE_EXHAUSTED).
pub const MAX_STREAMS: usize = 10_000;

/// Buckets over all streams; a new bucket beyond it gets no assignment.
pub const MAX_BUCKETS: usize = 100_000;

/// Responses waiting for a slow stream; when full, the book sends again later.
const STREAM_QUEUE: usize = 16;

/// The periodic work runs at most this often, however many streams ask for it.
const TICK_EVERY: Duration = Duration::from_millis(500);

/// How often a replica exchanges demands with the fleet through Redis.
const FLEET_EVERY: Duration = Duration::from_secs(1);

/// How long a replica's published demands hold in Redis without being refreshed.
const FLEET_HOLD: Duration = Duration::from_secs(15);

/// Limits exchanged with Redis at once.
const FLEET_BATCH: usize = 64;

/// What is wrong with a report, for INVALID_ARGUMENT.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadReport(pub String);

/// What a stream sends: a response, or why it ends.
pub type Outgoing = Result<RateLimitQuotaResponse, BadReport>;

/// A new stream: its id, a sender to end it with an error, and what it sends.
pub struct Opened {
    pub id: StreamId,
    pub tx: mpsc::Sender<Outgoing>,
    pub rx: mpsc::Receiver<Outgoing>,
}

/// A cheap `Clone` handle on the quota state of this process.
#[derive(Clone)]
pub struct RlqsHub {
    inner: Arc<HubInner>,
}

struct HubInner {
    state: Mutex<HubState>,
    next_id: AtomicU64,
    /// The limits the buckets are matched against.
    live: LiveLimits,
    clock: Clock,
    stats: Arc<RlqsStats>,
    fleet: Option<Fleet>,
    /// When the periodic work last ran: many streams call for it, once is enough.
    last_tick: Mutex<Option<Instant>>,
}

/// Shares computed over every replica's streams, through Redis.
struct Fleet {
    exchange: Arc<dyn DemandExchange>,
    replica: u64,
    /// When the last exchange started; one at a time, one a second.
    last: Mutex<Option<Instant>>,
    /// The limits this replica published, so it withdraws those it no longer has.
    published: Mutex<BTreeSet<String>>,
}

struct HubState {
    book: Book,
    outlets: FnvHashMap<StreamId, mpsc::Sender<Outgoing>>,
    /// The config the book's buckets were last matched against.
    config: Arc<Live>,
    /// The metrics' per-limit view is to be renewed even if nothing was sent.
    view_due: bool,
}

impl RlqsHub {
    /// The hub of this process, matching buckets against `live`'s limits and counting in
    /// `stats`; with an `exchange` (Redis), limits are split over every replica's streams.
    /// Under `global_shadow` (`SHADOW_MODE`) every bucket is allowed everything.
    pub fn new(
        live: LiveLimits,
        clock: Clock,
        stats: Arc<RlqsStats>,
        exchange: Option<Arc<dyn DemandExchange>>,
        global_shadow: bool,
    ) -> RlqsHub {
        let replica = rand::random::<u64>();
        let fleet = exchange.map(|exchange| Fleet {
            exchange,
            replica,
            last: Mutex::new(None),
            published: Mutex::new(BTreeSet::new()),
        });
        RlqsHub {
            inner: Arc::new(HubInner {
                fleet,
                last_tick: Mutex::new(None),
                state: Mutex::new(HubState {
                    book: Book::new(MAX_BUCKETS)
                        .replica(replica)
                        .global_shadow(global_shadow),
                    outlets: FnvHashMap::default(),
                    config: live.load_full(),
                    view_due: false,
                }),
                next_id: AtomicU64::new(1),
                live,
                clock,
                stats,
            }),
        }
    }

    /// A new stream and where its responses come out; `None` when too many are open.
    pub fn open(&self) -> Option<Opened> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        self.with(|st| {
            if st.outlets.len() >= MAX_STREAMS {
                return (None, Vec::new());
            }
            st.outlets.insert(id, tx.clone());
            st.book.open(id);
            tracing::debug!(stream = id, "RLQS stream opened");
            (Some(Opened { id, tx, rx }), Vec::new())
        })
    }

    /// Takes one usage report of `stream`.
    pub fn report(
        &self,
        stream: StreamId,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<(), BadReport> {
        let (domain, usages) = parse(reports)?;
        tracing::debug!(stream, domain, ?usages, "RLQS report");
        let now = self.now();
        let refused = self.with(|st| {
            let config = &st.config.config;
            let (out, full) = st.book.report(config, stream, &domain, usages, now);
            (full, out)
        });
        if refused > 0 {
            let q = &self.inner.stats;
            q.buckets_refused
                .fetch_add(refused as u64, Ordering::Relaxed);
            tracing::warn!(
                refused,
                max = MAX_BUCKETS,
                "RLQS quota book full: new buckets get no assignment"
            );
        }
        Ok(())
    }

    /// The stream ended; its shares go back to the others.
    pub fn close(&self, stream: StreamId) {
        let now = self.now();
        tracing::debug!(stream, "RLQS stream closed");
        self.with(|st| {
            st.outlets.remove(&stream);
            ((), st.book.close(stream, now))
        });
    }

    /// Periodic work (each open stream calls it every second; done at most twice a second):
    /// refreshes, retries, expiries.
    pub fn tick(&self) {
        {
            let mut last = self
                .inner
                .last_tick
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < TICK_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let now = self.now();
        self.with(|st| {
            // Demands move without pushes: the metrics' view is renewed here too.
            st.view_due = true;
            ((), st.book.tick(now))
        });
    }

    /// Whether limits are split over the fleet (Redis), so streams call [`RlqsHub::sync_fleet`].
    pub fn shares_fleet(&self) -> bool {
        self.inner.fleet.is_some()
    }

    /// Publishes this replica's demands per limit to Redis and splits each limit again over
    /// what every replica published; at most once a second (later calls return at once).
    pub async fn sync_fleet(&self) {
        let Some(fleet) = &self.inner.fleet else {
            return;
        };
        {
            let mut last = fleet.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < FLEET_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let mine = self.with(|st| (st.book.local_demands(), Vec::new()));
        let mut asks: Vec<(String, Vec<Option<f64>>)> = Vec::with_capacity(mine.len());
        {
            let mut published = fleet.published.lock().unwrap_or_else(|e| e.into_inner());
            let now: BTreeSet<String> = mine.iter().map(|(k, _)| k.clone()).collect();
            asks.extend(published.difference(&now).map(|k| (k.clone(), Vec::new())));
            *published = now;
        }
        asks.extend(mine);
        let now_ms = self.now() / 1_000_000;
        let mut got: Vec<(String, Vec<ReplicaDemands>)> = Vec::with_capacity(asks.len());
        for batch in asks.chunks(FLEET_BATCH) {
            let calls = batch.iter().map(|(key, demands)| {
                let exchange = &fleet.exchange;
                async move {
                    let r = exchange
                        .exchange(key, fleet.replica, demands, now_ms, FLEET_HOLD)
                        .await;
                    (key.clone(), demands.is_empty(), r)
                }
            });
            for (key, withdrawn, r) in futures_util::future::join_all(calls).await {
                match r {
                    Ok(remote) if !withdrawn => got.push((key, remote)),
                    Ok(_) => {}
                    Err(e) => {
                        let q = &self.inner.stats;
                        q.fleet_errors.fetch_add(1, Ordering::Relaxed);
                        // The counter key holds the bucket's values: its digest at warn.
                        let key = crate::telemetry::digest(&key);
                        tracing::warn!(error = %e, key, "RLQS: demand exchange with Redis failed");
                    }
                }
            }
        }
        let now = self.now();
        self.with(|st| {
            let mut out = Vec::new();
            for (key, remote) in got {
                out.extend(st.book.set_remote(&key, remote, now));
            }
            ((), out)
        });
    }

    fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// Runs `f` on the state, first matching the buckets again if a new config went live;
    /// delivers what it decided and updates the metrics.
    fn with<R>(&self, f: impl FnOnce(&mut HubState) -> (R, Outbox)) -> R {
        let live = self.inner.live.load_full();
        let now = self.now();
        let mut guard = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let mut out = Vec::new();
        if !Arc::ptr_eq(&live, &st.config) {
            st.config = live;
            out = st.book.reconfigure(&st.config.config, now);
        }
        let (r, more) = f(st);
        out.extend(more);
        let changed = !out.is_empty();
        self.deliver(st, out);
        self.count(st, changed);
        r
    }

    fn deliver(&self, st: &mut HubState, out: Outbox) {
        let q = &self.inner.stats;
        for (stream, actions) in out {
            let n = actions.len() as u64;
            tracing::debug!(stream, actions = ?Brief(&actions), "RLQS push");
            let sent = st.outlets.get(&stream).is_some_and(|tx| {
                tx.try_send(Ok(RateLimitQuotaResponse {
                    bucket_action: actions,
                }))
                .is_ok()
            });
            if sent {
                q.actions_sent.fetch_add(n, Ordering::Relaxed);
            } else {
                q.actions_undelivered.fetch_add(n, Ordering::Relaxed);
                st.book.undelivered(stream);
            }
        }
    }

    fn count(&self, st: &mut HubState, changed: bool) {
        let q = &self.inner.stats;
        q.streams.store(st.book.streams() as u64, Ordering::Relaxed);
        q.buckets.store(st.book.buckets() as u64, Ordering::Relaxed);
        if changed || std::mem::take(&mut st.view_due) {
            let view = st.book.view().into_iter().map(|l| QuotaLimit {
                domain: l.domain,
                key: l.key,
                requests_per_unit: l.requests_per_unit,
                demand: l.demand,
                shares: l.shares,
            });
            q.set_limits(view.collect());
        }
    }
}

/// Bucket actions in one line for the debug log: `{bucket} tokens/max/fill`, allow, deny,
/// abandon.
struct Brief<'a>(&'a [envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction]);

impl std::fmt::Debug for Brief<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
        use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as A;
        for a in self.0 {
            let id = a.bucket_id.as_ref().map(|b| bucket_key(&b.bucket));
            let what = match &a.bucket_action {
                Some(A::AbandonAction(_)) => "abandon".to_string(),
                Some(A::QuotaAssignmentAction(q)) => {
                    match q.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::TokenBucket(t)) => format!(
                            "{}/{}/{}s",
                            t.tokens_per_fill.map_or(0, |v| v.value),
                            t.max_tokens,
                            t.fill_interval.map_or(0, |d| d.seconds)
                        ),
                        Some(Strategy::BlanketRule(0)) => "allow".into(),
                        _ => "deny".into(),
                    }
                }
                None => "?".into(),
            };
            write!(f, "{id:?} {what}; ")?;
        }
        Ok(())
    }
}

/// A report's domain and usages, checked.
fn parse(r: RateLimitQuotaUsageReports) -> Result<(String, Vec<BucketUsage>), BadReport> {
    if r.domain.is_empty() {
        return Err(BadReport("domain is empty".into()));
    }
    let mut usages = Vec::with_capacity(r.bucket_quota_usages.len());
    for (i, u) in r.bucket_quota_usages.into_iter().enumerate() {
        let bad = |what: &str| BadReport(format!("bucket_quota_usages[{i}]: {what}"));
        let id = u.bucket_id.ok_or_else(|| bad("bucket_id is missing"))?;
        if id.bucket.is_empty() {
            return Err(bad("bucket_id has no entries"));
        }
        if id.bucket.len() > 4 * MAX_BUCKET_ENTRIES {
            return Err(bad("bucket_id has too many entries"));
        }
        if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
            return Err(bad("bucket_id has an empty key or value"));
        }
        // Envoy 1.40 sends 0 on a bucket's first report although the proto asks for more.
        let elapsed = u.time_elapsed.map_or(Duration::ZERO, |d| {
            Duration::new(
                d.seconds.max(0) as u64,
                d.nanos.clamp(0, 999_999_999) as u32,
            )
        });
        usages.push(BucketUsage {
            bucket: bucket_key(&id.bucket),
            elapsed,
            allowed: u.num_requests_allowed,
            denied: u.num_requests_denied,
        });
    }
    Ok((r.domain, usages))
}
