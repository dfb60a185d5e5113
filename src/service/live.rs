//! The limits being served: a config bound to its limits' stats and heavy hitters, swapped
//! whole when a new config goes live, so a request reads one consistent set.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::metrics::{BoundStats, LimitSeries, RequestStats};
use crate::config::{Config, ConfigError};
use crate::hitters::BoundTop;
use crate::hitters::TopTable;
use crate::telemetry::{Metrics, Pushed};

/// A config, its limits' stats and heavy hitters, swapped together.
#[derive(Debug, Default)]
pub struct Live {
    pub config: Config,
    pub stats: BoundStats,
    pub top: BoundTop,
}

impl AsRef<Config> for Live {
    fn as_ref(&self) -> &Config {
        &self.config
    }
}

/// A cheap `Clone` handle on the live limits: read them, or put a new config live. The tables
/// it binds keep each stat key's stats and heavy hitters across configs.
#[derive(Clone)]
pub struct LiveLimits {
    now: Arc<ArcSwap<Live>>,
    metrics: Arc<RequestStats>,
    top: Arc<TopTable>,
    /// What a config must pass besides its own validation to go live, from files or xDS
    /// alike: the store's (one that runs no scripts refuses the limits that need them).
    check: Option<ConfigCheck>,
}

/// A check of a config against what counts it, set once at start (see [`LiveLimits::check`]).
pub type ConfigCheck = Arc<dyn Fn(&Config) -> Result<(), ConfigError> + Send + Sync>;

impl LiveLimits {
    /// `config` live, its limits bound to `metrics`' per-limit stats and to `top`.
    pub fn new(config: Config, metrics: Arc<RequestStats>, top: Arc<TopTable>) -> LiveLimits {
        let live = bind(config, &metrics, &top);
        LiveLimits {
            now: Arc::new(ArcSwap::from_pointee(live)),
            metrics,
            top,
            check: None,
        }
    }

    /// The same, a config going live after this one checked by `check` first.
    pub fn checked_by(self, check: Option<ConfigCheck>) -> LiveLimits {
        LiveLimits { check, ..self }
    }

    /// Whether `config` may go live here: a reload calls it before [`LiveLimits::install`], and
    /// keeps the live config on an error.
    pub fn check(&self, config: &Config) -> Result<(), ConfigError> {
        self.check.as_ref().map_or(Ok(()), |c| c(config))
    }

    /// The limits being served now.
    pub fn load_full(&self) -> Arc<Live> {
        self.now.load_full()
    }

    /// Puts `config` live, from files or xDS alike: each limit keeps the stats its stat key had,
    /// and heavy hitters, so they survive without being copied. The server's reload records the
    /// load. Returns the limits it replaced: whoever drops the last handle on them frees them,
    /// which for a big config is worth doing off the workers.
    pub fn install(&self, config: Config) -> Arc<Live> {
        self.now
            .swap(Arc::new(bind(config, &self.metrics, &self.top)))
    }

    /// Drops the stats and heavy hitters of the stat keys no config being served has: call it
    /// once the limits [`LiveLimits::install`] replaced are freed.
    pub fn drop_unbound(&self) {
        self.metrics.limit_stats.drop_unbound();
        self.top.drop_unbound();
    }
}

/// The per-limit series of the limits live at each scrape and flush: a reload changes them, and
/// a removed limit's series goes.
impl Metrics for LiveLimits {
    fn render(&self, out: &mut String) {
        let live = self.load_full();
        self.series(&live).render(out);
    }

    fn push(&self, out: &mut Pushed) {
        let live = self.load_full();
        self.series(&live).push(out);
    }
}

impl LiveLimits {
    fn series<'a>(&'a self, live: &'a Live) -> LimitSeries<'a> {
        LimitSeries {
            metrics: &self.metrics,
            config: &live.config,
            stats: &live.stats,
        }
    }
}

fn bind(config: Config, metrics: &RequestStats, top: &TopTable) -> Live {
    Live {
        stats: metrics.limit_stats.bind(&config),
        top: top.bind(&config),
        config,
    }
}
