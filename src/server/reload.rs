//! The one way a new config goes live, whether it comes from the files (polling, SIGHUP) or
//! over xDS: valid, it is installed and counted; invalid, the old one stays live and the error
//! is logged and counted. xDS's updates are consumed here (`Install::follow`); a door's files
//! are read again by their `doors::Reload`, the config location's by [`Reloader`]. Every load,
//! the first one at start included, is recorded here ([`record`]) and nowhere else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{Config, ConfigError, LiveConfig, Sources};
use crate::service::{Live, LiveLimits, ReloadStats};
use crate::source::files::Watched;
use crate::source::{in_background, Update, Updates};

/// A file (or set of files) a door follows: polled every `TURNSTILE_RELOAD_INTERVAL_MS` from
/// `baseline`, read again on SIGHUP, each load recorded as every config load is (`ReloadStats`,
/// `ratelimit_service_config_load_*`, the status page).
#[derive(Clone)]
pub(super) struct Followed {
    pub(super) watched: Watched,
    pub(super) baseline: u64,
    pub(super) reload: Arc<dyn Reload>,
}

/// Reads a followed file again and puts it live, or keeps what is live and says why.
pub(super) trait Reload: Send + Sync {
    fn reload(&self) -> Result<(), ConfigError>;
}

impl Reload for Reloader {
    fn reload(&self) -> Result<(), ConfigError> {
        Reloader::reload(self)
    }
}

/// Records a config load: the success or error counter, the time of the last success, and the
/// load log's entry under `source` (none for the empty config xDS starts from, which nothing
/// loaded).
pub(super) fn record(stats: &ReloadStats, source: Option<&str>, loaded: Result<(), &ConfigError>) {
    match loaded {
        Ok(()) => stats.loaded(),
        Err(_) => stats.refused(),
    }
    if let Some(source) = source {
        let error = loaded.err().map(ToString::to_string);
        stats.log.record_now(source, error);
    }
}

/// Records a read of the file at `path` as a load ([`record`]), and says how it went.
pub(super) fn recorded<T>(
    stats: &ReloadStats,
    path: &std::path::Path,
    read: &Result<T, ConfigError>,
) -> Result<(), ConfigError> {
    let source = path.display().to_string();
    let result = read.as_ref().map(|_| ()).map_err(Clone::clone);
    record(stats, Some(&source), result.as_ref().map(|_| ()));
    result
}

/// What a reload uses: the live limits it replaces, and the stats it records loads in.
#[derive(Clone)]
pub(super) struct Install {
    live: LiveLimits,
    stats: Arc<ReloadStats>,
}

impl Install {
    /// Installs into `live`, recording loads in `stats`.
    pub(super) fn new(live: LiveLimits, stats: Arc<ReloadStats>) -> Install {
        Install { live, stats }
    }

    /// The config being served, for the build of the next one.
    pub(super) fn live(&self) -> LiveConfig {
        let live = self.live.clone();
        LiveConfig::new(move || live.load_full())
    }

    /// Applies one loaded (or refused) config from `source` (a path, or "xDS").
    pub(super) fn apply(
        &self,
        source: &str,
        loaded: Result<Config, ConfigError>,
    ) -> Result<(), ConfigError> {
        // The store's check too: a store that runs no scripts keeps out limits that need them.
        match loaded.and_then(|c| self.live.check(&c).map(|()| c)) {
            Ok(config) => {
                let domains = config.domains.len();
                let replaced = self.live.install(config);
                record(&self.stats, Some(source), Ok(()));
                tracing::info!(source, domains, "config reloaded");
                free_here(replaced);
                self.live.drop_unbound();
                Ok(())
            }
            Err(e) => {
                record(&self.stats, Some(source), Err(&e));
                tracing::error!(
                    source,
                    error = %e,
                    "config reload failed; the previous config stays live"
                );
                Err(e)
            }
        }
    }

    /// Applies every config `updates` yields from `source` (xDS), until the source ends, each in
    /// the background: binding a big config's stats and freeing the one it replaces take time.
    pub(super) async fn follow(&self, source: &'static str, mut updates: Updates) {
        while let Some(Update { loaded, handled }) = updates.recv().await {
            let install = self.clone();
            let _ = in_background(move || install.apply(source, loaded)).await;
            drop(handled);
        }
    }
}

/// Loads the config location (and GoCC's key file, `CONFIG_FILE`) again and applies it.
pub(super) struct Reloader {
    sources: Sources,
    install: Install,
    /// How many domains the live config has (for health under
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    domains: watch::Sender<usize>,
}

impl Reloader {
    pub(super) fn new(sources: Sources, install: Install, domains: usize) -> Reloader {
        Reloader {
            sources: Sources {
                live: install.live(),
                ..sources
            },
            install,
            domains: watch::Sender::new(domains),
        }
    }

    /// Loads the config location now and applies it (SIGHUP), on the calling thread.
    pub(super) fn reload(&self) -> Result<(), ConfigError> {
        self.apply(self.sources.load())
    }

    /// What the config location's files loaded, put live or refused.
    fn apply(&self, loaded: Result<Config, ConfigError>) -> Result<(), ConfigError> {
        let source = self.sources.path.display().to_string();
        if let Ok(c) = &loaded {
            log_gocc_warnings(c);
        }
        let domains = loaded.as_ref().ok().map(|c| c.domains.len());
        let applied = self.install.apply(&source, loaded);
        if let Some(n) = domains {
            self.domains.send_replace(n);
        }
        applied
    }

    /// The live config's domain count, as reloads change it.
    pub(super) fn domains(&self) -> watch::Receiver<usize> {
        self.domains.subscribe()
    }
}

/// Drops `replaced` once no call reads it any more, on this thread: freeing a config of a few
/// hundred thousand descriptors takes milliseconds, which a worker dropping the last handle
/// would spend between two calls. A call holds the live limits for its own span, so the wait
/// is short; past [`FREE_WAIT`] (a call held by a queue) the last reader frees them.
fn free_here(replaced: Arc<Live>) {
    let since = std::time::Instant::now();
    while Arc::strong_count(&replaced) > 1 && since.elapsed() < FREE_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(replaced);
}

/// How long a reload waits for the calls still reading the config it replaced.
const FREE_WAIT: Duration = Duration::from_millis(200);

/// GoCC's key file's fields GoCC would skip silently, as warnings.
pub fn log_gocc_warnings(config: &Config) {
    for (file, why) in (config.gocc.iter()).flat_map(|g| g.warnings.iter().map(|w| (&g.file, w))) {
        tracing::warn!(file = %file, "{why}");
    }
}
