//! Where configs come from, and when they change: the files of the config location (and
//! certificate files), polled by fingerprint, and an xDS management server. A source only reads
//! and notices: each yields the configs it reads as a stream of [`Update`]s, which the server's
//! one reload path consumes and decides what goes live.

mod background;
pub mod files;
pub mod xds;

pub use background::in_background;

use tokio::sync::{mpsc, oneshot};

use crate::config::{Config, ConfigError};

/// A config a source read, or why it was refused, on its way to the server's reload.
#[derive(Debug)]
pub struct Update {
    pub loaded: Result<Config, ConfigError>,
    /// Dropped by the reload once it has dealt with the update (put it live, or counted the
    /// refusal). xDS waits for it before it ACKs or NACKs, so a config is live before the
    /// management server hears it was taken.
    pub handled: Option<oneshot::Sender<()>>,
}

/// A source's updates, in the order it read them.
pub type Updates = mpsc::UnboundedReceiver<Update>;
