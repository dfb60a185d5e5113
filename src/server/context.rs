//! What the server builds once at start-up: the engine, the live limits, the request path, the
//! direct APIs and every subsystem's counters. Each adapter is handed the parts it uses, never
//! the whole (`server::start` says who gets what).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::{reload, StartError};
use crate::backend::redis::RedisStore;
use crate::config::Config;
use crate::durable::Journal;
use crate::hitters::TopTable;
use crate::limiter::{Clock, Engine, ShardTask, Store};
use crate::quota::DemandExchange;
use crate::service::{AnswerSettings, LiveLimits, RateLimiter, ThrottleService};
use crate::settings::{Backend, Settings};
use crate::telemetry::{Counters, RequestStats, StateStats};

/// The parts the adapters are built from. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// `ShouldRateLimit` (gRPC, `/json`), `/rate` and the admin listener's look-ups.
    pub limiter: RateLimiter,
    /// The shards every decision goes to: their clock, their stats, their drain at shutdown.
    pub engine: Engine,
    /// The limits being served, which the reload replaces and RLQS matches buckets against.
    pub live: LiveLimits,
    /// `THROTTLE` and `CL.THROTTLE`, over RESP and HTTP.
    pub throttle: ThrottleService,
    /// Heavy hitters per limit, by stat key (`/debug/top`, the status page).
    pub top: Arc<TopTable>,
    /// Every subsystem's counters, for the exposition; each part also goes to its subsystem.
    pub counters: Counters,
}

/// What the server starts from: the context, the shard actors to deal out to the workers, the
/// Redis store again as the RLQS fleet's exchange, and the durable counters' journal.
pub(super) struct Built {
    pub(super) cx: Context,
    pub(super) shard_tasks: Vec<ShardTask>,
    pub(super) fleet: Option<Arc<dyn DemandExchange>>,
    pub(super) journal: Option<Journal>,
}

impl Context {
    /// Connects the store (when Redis is set), starts the engine on it, and puts `config` live.
    /// The first config load is recorded here, through the reload's one recorder.
    pub(super) async fn build(
        settings: &Settings,
        config: Config,
        clock: Clock,
    ) -> Result<Built, StartError> {
        let mut fleet = None;
        let startup_retries = Arc::new(AtomicU64::new(0));
        let redis = match &settings.backend {
            Backend::Memory | Backend::Durable(_) => None,
            Backend::Redis(r) => {
                let store = RedisStore::connect(r, &startup_retries).await;
                let store = Arc::new(store.map_err(StartError::Redis)?);
                fleet = Some(store.clone() as Arc<dyn DemandExchange>);
                let store: Arc<dyn Store> = store;
                Some((store, r.policy.clone()))
            }
        };
        let (engine, mut shard_tasks) = Engine::with_store(
            settings.shards,
            settings.shard_queue_capacity,
            settings.max_waiters,
            clock,
            redis,
            settings.max_keys,
        );
        let state = Arc::new(StateStats::default());
        // Read back before any port serves: the first answer already counts what was saved.
        let journal = match &settings.backend {
            Backend::Durable(s) => Some(
                Journal::open(s, &engine, &mut shard_tasks, state.clone())
                    .map_err(StartError::State)?,
            ),
            Backend::Memory | Backend::Redis(_) => None,
        };
        let service = Arc::new(
            RequestStats::new(settings.near_limit_ratio)
                .with_max_detailed_series(settings.max_detailed_series),
        );
        let counters = Counters {
            service: service.clone(),
            shards: engine.stats().into(),
            redis_startup_retries: startup_retries,
            state,
            ..Counters::default()
        };
        let source = settings.config_path.display().to_string();
        let source = settings.xds.is_none().then_some(source.as_str());
        reload::record(&counters.reloads, source, Ok(()));
        let top = Arc::new(TopTable::new(settings.top_n).with_sample(settings.top_sample));
        top.tick(engine.clock().now());
        let live = LiveLimits::new(config, service.clone(), top.clone());
        let answer = AnswerSettings {
            response_headers: settings.response_headers.clone(),
            global_shadow_mode: settings.global_shadow_mode,
            request_limits: settings.request_limits,
            refused_hits: settings.refused_hits,
            global_quota_mode: settings.global_quota_mode,
            response_dynamic_metadata: settings.response_dynamic_metadata,
            refused_by_metadata: settings.refused_by_metadata,
        };
        let context = Context {
            limiter: RateLimiter::new(live.clone(), engine.clone(), answer, service),
            throttle: ThrottleService::new(engine.clone(), counters.throttle.clone()),
            engine,
            live,
            top,
            counters,
        };
        Ok(Built {
            cx: context,
            shard_tasks,
            fleet,
            journal,
        })
    }
}
