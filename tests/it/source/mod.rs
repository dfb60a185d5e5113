//! Where configs come from besides files (those are `server::reload`'s): xDS, from an in-test
//! ADS management server.

mod overlay;
mod overlay_files;
mod xds;
