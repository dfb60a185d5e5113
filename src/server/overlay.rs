//! The xDS overlay's files (`TURNSTILE_XDS_OVERLAY`): read at start, where a bad one stops the
//! start; polled as the config location is (a ConfigMap's `..data` swap included) and read again
//! on a change, each good one handed to the xDS client, which builds the last push again with
//! it and every push after. A bad one is logged and counted as a refused reload, and the last
//! good one stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::reload::Install;
use crate::config::{ConfigError, Overlay};
use crate::source::files::{fingerprint, poll, Watched};
use crate::source::in_background;

/// An overlay read from its files, and their fingerprint taken before they were read.
pub(super) type Loaded = (Arc<Overlay>, u64);

/// The overlay's files as the poller watches them: a file, or a directory's YAML files.
fn watched(path: &Path) -> Watched {
    Watched::Config {
        path: path.to_path_buf(),
        root: None,
        include_dotfiles: false,
        extra: Vec::new(),
    }
}

/// Reads the overlay at `path`, fingerprinted first, so a change made meanwhile is read again.
pub(super) fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let baseline = fingerprint(&watched(path));
    Ok((Arc::new(Overlay::load(path)?), baseline))
}

/// Polls the overlay at `path` every `interval` until `stop`, from the fingerprint `baseline`:
/// each change is read in the background and, good, sent on `overlays`; bad, refused through
/// `install` (logged, counted), the last good overlay staying.
pub(super) async fn follow(
    path: PathBuf,
    baseline: u64,
    interval: Duration,
    overlays: Arc<watch::Sender<Option<Arc<Overlay>>>>,
    install: Install,
    stop: watch::Receiver<bool>,
) {
    let source = path.display().to_string();
    let read = path.clone();
    let on_change = move || {
        let (read, source, overlays, install) = (
            read.clone(),
            source.clone(),
            overlays.clone(),
            install.clone(),
        );
        async move {
            match in_background(move || Overlay::load(&read)).await {
                Ok(Ok(overlay)) => {
                    tracing::info!(source, "xDS overlay read");
                    overlays.send_replace(Some(Arc::new(overlay)));
                }
                Ok(Err(e)) => {
                    let _ = install.apply(&source, Err(e));
                }
                Err(e) => tracing::error!(error = %e, "xDS overlay read did not finish"),
            }
        }
    };
    poll(watched(&path), baseline, interval, on_change, stop).await;
}
