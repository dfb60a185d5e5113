//! turnstile's black-box tests, one binary: the real server on port 0 (in-process, or the
//! binary cargo built), real clients, real Envoy, real Redis. A folder is one concern, over the
//! shared fixtures in `common/`; run one with a filter, e.g. `cargo test --test it -- ops::`
//! (a filter matches any test whose path contains it, so name a folder with its `::`).
//!
//! One binary, not one per file: every test binary compiled `common/` again and linked the
//! library and its dependencies again, and CI building thirty of them ran out of disk.

// `pub` in a test binary means "for the other test modules": nothing here is reachable from
// outside, and `pub(crate)` everywhere would say nothing more.
#![allow(unreachable_pub)]

mod common;

mod backends;
mod direct;
mod durable;
mod envoy;
mod hostile;
mod image;
mod ops;
mod promises;
mod quota;
mod reference;
mod service;
