//! Where configs come from, and when they change: the files of the config location (and
//! certificate files), polled by fingerprint, and an xDS management server. A source only reads
//! and notices; the server's one reload path decides what goes live.

pub mod files;
pub mod xds;
