//! The xDS overlay's files (`TURNSTILE_XDS_OVERLAY`): read at start, where a bad one stops the
//! start; then a file the xDS door follows (`doors::Followed`), polled as the config location is
//! (a ConfigMap's `..data` swap included) and read again on a change or SIGHUP, each good one
//! handed to the xDS client, which builds the last push again with it and every push after. A
//! bad one is logged and counted as a refused reload, and the last good one stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use super::reload::{Followed, Install, Reload};
use crate::config::{ConfigError, Overlay};
use crate::source::files::{fingerprint, Watched};

/// An overlay read from its files, and their fingerprint taken before they were read.
#[derive(Debug)]
pub struct LoadedOverlay {
    pub overlay: Arc<Overlay>,
    /// The files' fingerprint before they were read, so a change made meanwhile is read again.
    pub baseline: u64,
}

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
pub(super) fn load(path: &Path) -> Result<LoadedOverlay, ConfigError> {
    let baseline = fingerprint(&watched(path));
    Ok(LoadedOverlay {
        overlay: Arc::new(Overlay::load(path)?),
        baseline,
    })
}

/// The overlay's files as the xDS door follows them: polled and read again on SIGHUP as every
/// followed file is; a good read goes to the xDS client on `overlays`, which builds the last
/// push again with it; a bad one is refused through `install` (logged, counted), the last good
/// overlay staying.
pub(super) struct OverlayFile {
    pub(super) path: PathBuf,
    pub(super) overlays: Overlays,
    pub(super) install: Install,
}

/// The overlay in force, for the xDS client: none without one.
pub(super) type Overlays = Arc<watch::Sender<Option<Arc<Overlay>>>>;

impl OverlayFile {
    /// Followed from `baseline`, its fingerprint before the start read it.
    pub(super) fn followed(self, baseline: u64) -> Followed {
        Followed {
            watched: watched(&self.path),
            baseline,
            reload: Arc::new(self),
        }
    }
}

impl Reload for OverlayFile {
    fn reload(&self) -> Result<(), ConfigError> {
        let source = self.path.display().to_string();
        match Overlay::load(&self.path) {
            Ok(overlay) => {
                tracing::info!(source, "xDS overlay read");
                self.overlays.send_replace(Some(Arc::new(overlay)));
                Ok(())
            }
            Err(e) => self.install.apply(&source, Err(e)),
        }
    }
}
