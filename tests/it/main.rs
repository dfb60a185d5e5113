//! turnstile's black-box tests, one binary: the real server on port 0 (in-process, or the
//! binary cargo built), real clients, real Envoy, real Redis, over the shared fixtures in
//! `common/`. A folder is one behaviour a user sees, named as `src` names the module that does it:
//!
//! - `service`: `ShouldRateLimit`'s answers, algorithms, queues, budgets, reservations, request
//!   limits, the admin listener's look-ups and resets.
//! - `storage`: where counts live, every scenario on every storage (memory, durable, Redis,
//!   local-first), then Redis's and local-first's own behaviour.
//! - `durable`, `quota` (RLQS), `direct` (the direct APIs), `envoy` (through a real Envoy).
//! - `limiter`: the engine under a key flood and an overload.
//! - `limitador`: started as `limitador-server`, as limitador-operator starts Limitador.
//! - `server`: reload, TLS, unix sockets, shutdown. `source`: configs over xDS.
//! - `settings`: the environment read and refused. `cli`: `check` and `serve`.
//! - `telemetry`: metrics on every port, statsd, mapped series, dashboards, logs, traces, client
//!   values. `hitters`: `/debug/top` and the status page. `config`: configs at scale.
//! - `docs`: what the docs and examples promise. `fuzz`: the fuzzers' findings replayed.
//!   `image`: the container image.
//! - `reference`: envoyproxy/ratelimit's own tests, ported file by file: kept together because
//!   the behaviour they pin is the drop-in's (the reference's answers and stats), and each file
//!   reads beside the Go file it ports, case for case.
//!
//! Run one with a filter, e.g. `cargo test --test it -- telemetry::` (a filter matches any test
//! whose path contains it, so name a folder with its `::`).
//!
//! One binary, not one per file: every test binary compiled `common/` again and linked the
//! library and its dependencies again, and CI building thirty of them ran out of disk.

// `pub` in a test binary means "for the other test modules": nothing here is reachable from
// outside, and `pub(crate)` everywhere would say nothing more.
#![allow(unreachable_pub)]

mod common;

mod cli;
mod config;
mod direct;
mod docs;
mod durable;
mod envoy;
mod fuzz;
mod hitters;
mod image;
mod limitador;
mod limiter;
mod reference;
mod rlqs;
mod server;
mod service;
mod settings;
mod source;
mod storage;
mod telemetry;
