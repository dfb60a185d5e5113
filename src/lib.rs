//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit.
//!
//! Envoy's ratelimit filter calls `ShouldRateLimit` with a domain and descriptors. The gRPC
//! adapter (`service::grpc`) hands the request to [`service::RateLimiter`], which validates it,
//! matches each descriptor against the config tree (`descriptor`), and turns every limit that
//! applies into an op: a counter key, its FNV-1a hash, the limit's parameters and the hits.
//!
//! The ops go to the shard actors of the `limiter` engine: the hash picks one of N shards, each a
//! tokio task owning the state and wait queues of its keys, reached through a bounded channel. A
//! request sends one message per shard it touches, never one per descriptor; a shard decides the
//! ops of a message together, so a request held by one shard is decided atomically, and a
//! request refused anywhere consumes nothing anywhere. Counting rules (`limiter::State`) are pure
//! functions of the time, which is a parameter (`limiter::Clock`), so tests never sleep.
//!
//! `server` lays the runtimes out for speed: one current-thread runtime per worker thread, each
//! accepting gRPC connections (plain, TLS or a unix socket) and hosting its share of the shards;
//! one more thread serves HTTP, the debug and Prometheus ports, the RESP transport, and watches
//! the config and certificate files. `config` reads the YAML and environment of
//! envoyproxy/ratelimit into validated types (or takes them over xDS, `config::xds`); `admin`
//! serves HTTP health, `/json`, the direct `/rate` and `/throttle` APIs, metrics and the loaded
//! config; `telemetry` keeps counters, histograms and capped per-value series, and sets up logs
//! and traces. With `backend::redis`, shards count in Redis instead of their tables, batching
//! decisions into pipelines, behind a circuit breaker that falls back to the tables.

pub mod admin;
pub mod backend;
pub mod config;
pub mod descriptor;
pub mod limiter;
pub mod server;
pub mod service;
pub mod telemetry;
pub mod transport;
