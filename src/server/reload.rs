//! The one way a new config goes live, whether it comes from the files (polling, SIGHUP) or
//! over xDS: valid, it is installed and counted; invalid, the old one stays live and the error
//! is logged and counted.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::config::{Config, ConfigError, LoadOptions};
use crate::service::RateLimiter;

/// Applies one loaded (or refused) config from `source` (a path, or "xDS").
pub(super) fn apply(
    limiter: &RateLimiter,
    source: &str,
    loaded: Result<Config, ConfigError>,
) -> Result<(), ConfigError> {
    match loaded {
        Ok(config) => {
            let domains = config.domains.len();
            limiter.install(config);
            limiter.metrics().reloads.record_now(source, None);
            tracing::info!(source, domains, "config reloaded");
            Ok(())
        }
        Err(e) => {
            limiter
                .metrics()
                .config_load_error
                .fetch_add(1, Ordering::Relaxed);
            (limiter.metrics().reloads).record_now(source, Some(e.to_string()));
            tracing::error!(
                source,
                error = %e,
                "config reload failed; the previous config stays live"
            );
            Err(e)
        }
    }
}

/// Loads the config location again and applies it.
pub(super) struct Reloader {
    path: PathBuf,
    opts: LoadOptions,
    limiter: RateLimiter,
}

impl Reloader {
    pub(super) fn new(path: PathBuf, opts: LoadOptions, limiter: RateLimiter) -> Reloader {
        Reloader {
            path,
            opts,
            limiter,
        }
    }

    pub(super) fn reload(&self) -> Result<(), ConfigError> {
        let source = self.path.display().to_string();
        apply(&self.limiter, &source, Config::load(&self.path, self.opts))
    }
}
