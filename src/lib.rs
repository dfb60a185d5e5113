//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit.
//!
//! Envoy's ratelimit filter calls `ShouldRateLimit` with a domain and descriptors. The gRPC
//! adapter (`transport::grpc`) hands the request to [`service::RateLimiter`], which validates it,
//! matches each descriptor against the limit tree (`descriptor`), and plans an op for every limit
//! that applies: a counter key, its FNV-1a hash, the limit's parameters and the hits. The ops go
//! to the `limiter` engine: the hash picks one of N shard actors, each owning the state and the
//! wait queues of its keys; a request sends one message per shard it touches, a shard decides
//! the ops of a message together, and a request refused anywhere consumes nothing anywhere,
//! except usage reported after the fact (a descriptor's own `hits_addend`), which counts in full
//! (`limiter::Counting`). Counting rules are pure functions of the time, which is a parameter
//! (`limiter::Clock`).
//!
//! # The house
//!
//! Modules form layers and every arrow points down (`python3 ../shared/tools/module-graph.py
//! src` prints `no cycles`). From the top:
//!
//! | module | room for | uses |
//! |---|---|---|
//! | `main.rs`, `cli` | CLI → settings → telemetry → `server::run` with a shutdown future | all |
//! | `server` | listeners, worker runtimes, the admin thread, the one reload path, lingering close, drain | the layers below |
//! | `settings` | the one reader of the environment: one grammar for booleans, durations, numbers and addresses; every subsystem gets a plain typed struct | the structs it fills |
//! | `transport` | gRPC adapters (`ShouldRateLimit`, RLQS streams), HTTP (`/json`, `/rate`, `/throttle`, health, debug, metrics, the debug port's status page and `/debug/top`, the admin listener's look-up and reset), RESP `THROTTLE` and `CL.THROTTLE`: each a thin adapter | `quota`, `service`, `telemetry` |
//! | `quota` | RLQS: buckets onto limits, demand, max-min fair shares, the assignments Envoy enforces (`book`, pure); the process-wide hub the streams share, the fleet's demand through Redis | `service`, `backend::redis`, `descriptor`, `telemetry`, `config` |
//! | `service` | a request's way through: validate → plan → engine → answer; the direct APIs' decisions; admin look-ups and resets, planned as requests | `limiter`, `descriptor`, `telemetry`, `config` |
//! | `telemetry` | counters, per-limit stats and heavy hitters (`top`: space-saving per limit) bound by stat key, config load log, Prometheus text, the statsd/DogStatsD push (`statsd`), logs, traces | `limiter` (shard gauges), `config` |
//! | `backend::redis` | the limiter's store contract over Redis: connections, key layout, scripts, reply decoding; the RLQS demand exchange | `limiter`, `config` |
//! | `limiter` | algorithms, shard actors, wait queues and their process-wide budget, the store contract, round trips to the store and their breaker (`shard::round_trip`), local-first views and their syncs (`shard::synced`), the request verdict | `descriptor`, `config` |
//! | `descriptor` | limit-tree matching, counter keys, key hashing and shard choice | `config` |
//! | `config` | the validated model (units, algorithms, queues, the tree) built from YAML or xDS, and GoCC's JSON key file; the duration grammar; Go regexps | nothing |
//!
//! Why `settings` sits above the subsystems rather than at the bottom: it fills each
//! subsystem's own settings struct (`backend::redis::RedisSettings`, `config::xds::XdsSettings`,
//! `transport::resp::RespSettings`, ...), so a subsystem never learns where its values came from
//! and nothing below `settings` reads the environment (linkerd2-proxy's `app/src/env.rs`).
//!
//! `server` lays the runtimes out for speed: one current-thread runtime per worker thread, each
//! accepting gRPC connections (plain, TLS or a unix socket) and hosting its share of the shards,
//! so a call whose key lives on its own worker decides synchronously; one more thread serves
//! HTTP, the debug and Prometheus ports, the RESP transport, and watches the config and the
//! certificate files. A new config, from files, SIGHUP or xDS, goes live through one function
//! (`server::reload`), and per-limit stats, bound by stat key (`telemetry::LimitStatsTable`),
//! survive it.

pub mod backend;
pub mod cli;
pub mod config;
pub mod descriptor;
pub mod limiter;
pub mod quota;
pub mod server;
pub mod service;
pub mod settings;
pub mod telemetry;
pub mod transport;
