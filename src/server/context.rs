//! What the server builds once at start-up: the engine, the live limits, the request path, the
//! direct APIs and every subsystem's stats. Each adapter is handed the parts it uses, never
//! the whole (`server::start` says who gets what).

use std::sync::Arc;

use super::tls::TlsStats;
use super::{reload, StartError};
use crate::config::Config;
use crate::durable::{Journal, StateStats};
use crate::hitters::TopTable;
use crate::limiter::{Clock, Engine, EngineSizes, EngineStats, ShardTask, SharedStore};
use crate::service::metrics::{DoorCalls, RequestStats};
use crate::service::ReloadStats;
use crate::service::{AnswerSettings, ConfigCheck, EnvoyService, LiveLimits};
use crate::settings::{Settings, Storage};
use crate::store::redis::{RedisErrors, RedisStore, StartupRetries};
use crate::telemetry::{Metrics, Registry, StatsdStats};
use crate::transport::http::{AdminStats, StatusStats};
use crate::transport::waiting::{StartWait, WaitingFor};

/// The parts the adapters are built from. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// `ShouldRateLimit` (gRPC, `/json`), `/rate` and the admin listener's look-ups.
    pub envoy: EnvoyService,
    /// The shards every decision goes to: their clock, their stats, their drain at shutdown.
    pub engine: Engine,
    /// The limits being served, which the reload replaces and RLQS matches buckets against.
    pub live: LiveLimits,
    /// Heavy hitters per limit, by stat key (`/debug/top`, the status page).
    pub top: Arc<TopTable>,
    /// Every part's stats, registered for the exposition and the push.
    pub registry: Registry,
    /// The same parts by type, each handed to the subsystem that counts in it.
    pub stats: Stats,
}

/// Each subsystem's stats, as `Context::build` made them; `Registry` holds them too, for
/// the exposition.
#[derive(Clone)]
pub struct Stats {
    /// `ShouldRateLimit`'s per-limit stats (the request path, the status page).
    pub requests: Arc<RequestStats>,
    /// Every door's calls, errors and latency (the call layers, the status page).
    pub calls: Arc<DoorCalls>,
    /// One per shard, with its link's (the status page, the health check).
    pub shards: EngineStats,
    /// Config loads (`server::reload`, the status page).
    pub reloads: Arc<ReloadStats>,
    pub(crate) tls: Arc<TlsStats>,
    pub admin: Arc<AdminStats>,
    pub statsd: Arc<StatsdStats>,
}

impl Stats {
    /// Every part's stats, in the order `/metrics` shows them: these, and those the engine,
    /// Redis (its start's retries, its round trips' errors: zeros without Redis, as the
    /// dashboards read them), the throttle service and the live limits hold.
    fn register(
        &self,
        redis: RedisStats,
        state: Arc<StateStats>,
        engine: &Engine,
        live: &LiveLimits,
        doors: Vec<Arc<dyn Metrics>>,
    ) -> Registry {
        let mut parts = vec![
            self.calls.clone() as Arc<dyn Metrics>,
            self.statsd.clone(),
            self.reloads.clone(),
            redis.retries,
            self.tls.clone(),
            Arc::new(engine.metrics()),
            redis.errors,
            self.admin.clone(),
            state,
        ];
        parts.extend(doors);
        parts.push(Arc::new(live.clone()));
        Registry::new(parts)
    }

    /// What the status page counts.
    pub(super) fn status(&self) -> StatusStats {
        StatusStats {
            requests: self.requests.clone(),
            calls: self.calls.clone(),
            shards: self.shards.clone(),
            reloads: self.reloads.clone(),
        }
    }
}

/// Redis's stats, made before it is connected (zeros without Redis): its start's retries, its
/// round trips' errors.
struct RedisStats {
    retries: Arc<StartupRetries>,
    errors: Arc<RedisErrors>,
}

/// What the server starts from: the context, the shard actors to deal out to the workers, the
/// Redis store again (RLQS shares demand with the fleet through it), and the durable counters'
/// journal.
pub(super) struct Built {
    pub(super) cx: Context,
    pub(super) shard_tasks: Vec<ShardTask>,
    pub(super) redis: Option<Arc<RedisStore>>,
    pub(super) journal: Option<Journal>,
}

/// What the start shares with the ports that answer while it waits: what it waits for, and the
/// stats made before the context (the Redis retries, which those ports serve; TLS's, which
/// the certificates, read first, count in).
pub(super) struct Starting {
    pub(super) wait: StartWait,
    pub(super) retries: Arc<StartupRetries>,
    pub(super) tls: Arc<TlsStats>,
    /// The doors' own stats, made before the doors (`doors::DoorStats`), registered here.
    pub(super) doors: Vec<Arc<dyn Metrics>>,
}

impl Starting {
    /// A start that waits as `wait` says, none of its stats counted yet; `doors` the doors'.
    pub(super) fn new(wait: StartWait, doors: Vec<Arc<dyn Metrics>>) -> Starting {
        Starting {
            wait,
            retries: Arc::default(),
            tls: Arc::default(),
            doors,
        }
    }
}

/// With a state dir, the durable counters read back into the shards, before any port serves:
/// the first answer already counts what was saved. Read on the blocking pool, so the start's
/// runtime answers the ports and the stop meanwhile; the shard tasks go there and come back.
async fn read_back(
    settings: &Settings,
    engine: &Engine,
    shard_tasks: Vec<ShardTask>,
    state: &Arc<StateStats>,
    wait: &StartWait,
) -> Result<(Option<Journal>, Vec<ShardTask>), StartError> {
    let Storage::Durable(s) = &settings.storage else {
        return Ok((None, shard_tasks));
    };
    wait.set(Some(WaitingFor::State));
    let (s, engine, state) = (s.clone(), engine.clone(), state.clone());
    let mut tasks = shard_tasks;
    let read = tokio::task::spawn_blocking(move || {
        let opened = Journal::open(&s, &engine, &mut tasks, state);
        (opened, tasks)
    });
    let (opened, tasks) = read.await.map_err(|e| StartError::State(e.to_string()))?;
    Ok((Some(opened.map_err(StartError::State)?), tasks))
}

impl Context {
    /// Connects the store (when Redis is set), starts the engine on it, and puts `config` live.
    /// The first config load is recorded here, through the reload's one recorder.
    pub(super) async fn build(
        settings: &Settings,
        config: Config,
        clock: Clock,
        starting: Starting,
        source: Option<String>,
    ) -> Result<Built, StartError> {
        let redis = RedisStats {
            retries: starting.retries,
            errors: Arc::new(RedisErrors::new(settings.shards)),
        };
        let wait = starting.wait;
        let connected = connect_store(settings, &config, &redis, &wait).await?;
        let Connected {
            store,
            redis: shared,
            check,
        } = connected;
        let sizes = EngineSizes {
            shards: settings.shards,
            messages: settings.shard_queue_capacity,
            max_waiters: settings.max_waiters,
            max_keys: settings.max_keys,
        };
        let (engine, shard_tasks) = Engine::with_store(sizes, clock, store);
        let state = Arc::new(StateStats::default());
        let (journal, shard_tasks) =
            read_back(settings, &engine, shard_tasks, &state, &wait).await?;
        wait.set(None);
        let service = Arc::new(
            RequestStats::new(settings.near_limit_ratio)
                .with_max_detailed_series(settings.max_detailed_series),
        );
        let stats = Stats {
            requests: service.clone(),
            calls: Arc::default(),
            shards: engine.metrics(),
            reloads: Arc::default(),
            tls: starting.tls,
            admin: Arc::default(),
            statsd: Arc::default(),
        };
        reload::record(&stats.reloads, source.as_deref(), Ok(()));
        let top = Arc::new(TopTable::new(settings.top_n).with_sample(settings.top_sample));
        top.tick(engine.clock().now());
        let live = LiveLimits::new(config, service.clone(), top.clone()).checked_by(check);
        let registry = stats.register(redis, state, &engine, &live, starting.doors);
        let answer = AnswerSettings {
            response_headers: settings.response_headers.clone(),
            global_shadow_mode: settings.global_shadow_mode,
            request_limits: settings.request_limits,
            counting_rule: settings.counting_rule,
            global_quota_mode: settings.global_quota_mode,
            response_dynamic_metadata: settings.response_dynamic_metadata,
            refused_by_metadata: settings.refused_by_metadata,
        };
        let context = Context {
            envoy: EnvoyService::new(live.clone(), engine.clone(), answer, service),
            engine,
            live,
            top,
            registry,
            stats,
        };
        Ok(Built {
            cx: context,
            shard_tasks,
            redis: shared,
            journal,
        })
    }
}

/// What the start connected to: with Redis, the store the shards count in (used as its policy
/// says), and the same store for the doors that share it with replicas (RLQS's demand), one
/// connection for both; neither otherwise.
#[derive(Default)]
struct Connected {
    store: Option<SharedStore>,
    redis: Option<Arc<RedisStore>>,
    /// The store's check of every config before it goes live, the first one included.
    check: Option<ConfigCheck>,
}

/// With Redis, the store (`Connected`), connected while the start waits for it, and the store's
/// check of `config` (the first of the configs it checks); nothing otherwise.
async fn connect_store(
    settings: &Settings,
    config: &Config,
    redis: &RedisStats,
    wait: &StartWait,
) -> Result<Connected, StartError> {
    let Storage::Redis(r) = &settings.storage else {
        return Ok(Connected::default());
    };
    wait.set(Some(WaitingFor::Redis));
    let store = RedisStore::connect(r, &redis.retries, &redis.errors).await;
    let store = Arc::new(store.map_err(StartError::Redis)?);
    // Limitador's limits all count from their first hit, through a script.
    if settings.limitador.is_some() {
        store.check_first_hit().map_err(StartError::Redis)?;
    }
    let checked = store.clone();
    let check: ConfigCheck = Arc::new(move |c: &Config| checked.check_config(c));
    check(config).map_err(|e| StartError::Redis(e.to_string()))?;
    let shared = store.clone();
    let policy = r.policy.clone();
    Ok(Connected {
        store: Some(SharedStore { store, policy }),
        redis: Some(shared),
        check: Some(check),
    })
}
