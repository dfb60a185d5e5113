//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit.
//!
//! Envoy's ratelimit filter calls `ShouldRateLimit` with a domain and descriptors. The gRPC
//! adapter (`transport::grpc`) reads the request where it lies in the call's bytes
//! (`transport::codec`) and hands it to [`service::RateLimiter`], which validates it,
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
//! | `server` | builds one `Context` (engine, live limits, request path, direct APIs, heavy hitters, every subsystem's counters) and hands each adapter the parts it uses; listeners, worker runtimes, the admin thread, the one reload path (it alone consumes the sources' updates and records config loads, holding their counters), TLS and its counters, lingering close, drain | the layers below |
//! | `settings` | the one reader of the environment: one grammar for booleans, durations, numbers and addresses; every subsystem gets a plain typed struct | the structs it fills |
//! | `source` | where configs come from: the config location and certificate files, polled by fingerprint (`files`); the xDS (ADS) client (`xds`); each yields what it read as a stream of `Update`s that `server`'s reload consumes | `config` |
//! | `transport` | gRPC adapters (`ShouldRateLimit`, RLQS streams), HTTP (`/json`, `/rate`, `/throttle`, health, debug, metrics, the debug port's status page and `/debug/top`, the admin listener's look-up, reset, clear heavy hitters and digests, holding its counters; each port shows client values as `telemetry::client_values` rules), RESP `THROTTLE` and `CL.THROTTLE` (over `service::ThrottleService`): each a thin adapter given only what it uses | `quota`, `service`, `telemetry`, `hitters` |
//! | `backend::redis` | the limiter's store contract over Redis: connections, key layout, scripts, reply decoding; RLQS's demand exchange over Redis | `quota` (the exchange contract), `limiter`, `config` |
//! | `quota` | RLQS: buckets onto limits, demand, max-min fair shares, the assignments Envoy enforces (`book`, pure); the process-wide hub the streams share, holding the quota counters and reading the live limits; the contract of the place replicas exchange demands (`exchange`) | `service`, `descriptor`, `limiter` (the clock), `telemetry`, `config` |
//! | `service` | a request's way through: validate → plan → engine → answer, counting in `ShouldRateLimit`'s counters; the live limits (`LiveLimits`: a config bound to its stats and heavy hitters, swapped whole); the direct APIs' decisions (`ThrottleService`, holding the throttle counters); admin look-ups and resets, planned as requests | `limiter`, `descriptor`, `telemetry`, `hitters`, `config` |
//! | `telemetry` | the counters' types (each subsystem holds and updates its own; `Counters` gathers handles on them for rendering), per-limit stats bound by stat key, config load log, Prometheus text, the statsd/DogStatsD push (`statsd`), logs, traces; how client values leave the process (`client_values`: clear, or a keyed digest) | `hitters`, `limiter` (shard gauges), `config` |
//! | `hitters` | the heavy-hitters feature: space-saving lists per limit, bound by stat key (the table held by `service::LiveLimits` and handed to the status page), behind `/debug/top` and the status page | `config` |
//! | `limiter` | algorithms, counter keys (`key::Key`: text and hash) and the shard choice, shard actors (`actor`, `same_thread`), the shard in owned parts (`shard::counters`, `shard::queues` with the process-wide waiter budget, and its mode: memory, or `shard::link::Link` to a store with its round trips, breaker and local-first views), the store contract, the request verdict | `config` |
//! | `descriptor` | limit-tree matching and counter keys' text | `config` |
//! | `config` | the validated model (units, algorithms, queues, the tree) built from YAML or xDS resources, and GoCC's JSON key file; the duration grammar; Go regexps; no I/O besides reading the files it is given | nothing |
//!
//! Why `settings` sits above the subsystems rather than at the bottom: it fills each
//! subsystem's own settings struct (`backend::redis::RedisSettings`, `source::xds::XdsSettings`,
//! `transport::resp::RespSettings`, ...), so a subsystem never learns where its values came from
//! and nothing below `settings` reads the environment (linkerd2-proxy's `app/src/env.rs`).
//!
//! `server` lays the runtimes out for speed: one current-thread runtime per worker thread, each
//! accepting gRPC connections (plain, TLS or a unix socket) and hosting its share of the shards,
//! so a call whose key lives on its own worker decides synchronously; every worker also accepts
//! RESP and HTTP connections from the one RESP socket and the one HTTP socket, for the same
//! reason. One more thread serves the debug and Prometheus ports, and watches the config and the
//! certificate files. A new config, from files, SIGHUP or xDS, goes live through one path
//! (`server::reload`), and per-limit stats, bound by stat key (`telemetry::LimitStatsTable`),
//! survive it. `server::Context` is built once at start; each adapter gets only its parts (the
//! gRPC workers the request path and its counters, the RLQS hub the live limits, the clock and
//! the quota counters, the RESP transport the throttle service, the status page the counters,
//! the live limits and the heavy hitters), so the module graph shows what each really uses.

//! # Where the house is going (the second pass)
//!
//! The table above is the house today. The second pass moves it, in steps that each keep every
//! test green, to this tree (one concept a room, one word a concept); a step's row says what is
//! done.
//!
//! ```text
//! src/
//!   main.rs, cli.rs      CLI → settings → telemetry → server::run (≤ 100 lines in main.rs)
//!   server/              builds one context and hands each adapter what it uses; the one
//!                        reload path (the only place a config load is recorded)
//!   source/              where configs come from: files (poll, SIGHUP) and xDS (ADS client);
//!                        each yields the first config and a stream of updates for `server`
//!   settings/            the one reader of the environment
//!   transport/           thin adapters: grpc.rs (ShouldRateLimit, its per-call layer) and
//!                        codec/ (the request read where it lies, the answer in one pass),
//!                        http/, resp/, rlqs
//!   quota/               RLQS: book (pure), hub; the fleet exchange as a trait that
//!                        backend::redis implements (above quota, as it implements it)
//!   service/             request.rs (the request, borrowed, and its bounds) → plan → engine
//!                        → answer; the direct APIs' decisions
//!   telemetry/           counters each subsystem owns, Prometheus text, statsd, logs, traces
//!   hitters/             the heavy-hitters feature (`/debug/top`, space-saving per limit)
//!   backend/redis/       the store and exchange contracts over Redis: connections, keys, scripts
//!   limiter/
//!     mod.rs             Engine: routes a request's ops to the shards owning their keys
//!     key.rs             Key: the counter key's text and its hash together; the shard choice
//!     op.rs              Op, Role, Counting, Outcome: the vocabulary of one decision, and the
//!                        request's verdict (`refuses`), worked out once, carried in the Decision
//!     protocol.rs        every message a shard takes and every answer it gives
//!     algorithm/         fixed window, sliding window, token bucket (pure; time a parameter)
//!     store.rs           the store contract (memory keeps no store; Redis is one)
//!     actor.rs, same_thread.rs   how callers reach a shard (its task; in place on its thread)
//!     shard/
//!       mod.rs           Shard = Counters + Queues + Mode; `handle` dispatches a message
//!       counters.rs      the key table (`table.rs`), its cap, eviction, sweep, the refused set,
//!                        grants, the direct API's refusals
//!       queues.rs        FIFO wait queues, their events, the waiters and their process budget
//!       link/            Mode::Store(Link): the batch, round trips in order (`round_trip.rs`),
//!                        the Breaker (`breaker.rs`), local-first views and syncs (`views.rs`)
//!       decide.rs        a message against the counters: the parts borrowed together as a
//!                        Decider; with the queues in wait.rs, through the link in
//!                        through_store.rs, admin look-ups, resets, releases in admin.rs
//!   descriptor/          matching a request's descriptors against the limit tree (only that)
//!   config/              the validated model (pure: no I/O, no clients)
//! tests/it/              one integration-test binary, a folder per concern, shared helpers
//! docs/                  the reference by topic; README is the way in
//! ```
//!
//! | step | what moves | state |
//! |---|---|---|
//! | 1 | one integration-test binary; the test script builds the fuzz crate, benches, examples (and runs each fuzz target briefly where nightly and cargo-fuzz are installed) | done |
//! | 2 | README short, the reference in `docs/` by topic; BENCHMARKS.md by question | done |
//! | 3 | `limiter/op.rs` and `limiter/protocol.rs` (done: shard parts import them from there, not through `limiter`); key hashing and the shard choice owned by the limiter (done: `limiter::key`, so `limiter` no longer uses `descriptor`); a `Key` type holding text and hash together (done: `limiter::key::Key`, hashed once, four side by side in `plan`; the shard's maps of keys hash by it, `KeyMap`); the verdict in `Decision` (done: worked out once, by the shard holding the whole request or by the engine across shards, and read by the answer; a quota group is a descriptor's limits, over when one of them is) | done |
//! | 4 | the shard in owned parts (`Counters`, `Queues`, `link::Link` with `Breaker` and `Views`), the mode an enum | done: each part a type with its own fields and methods, none importing its parent; `Mode::{Memory, Store(Link)}` chosen once; `Decider` borrows the parts to decide a message; actor and same-thread access moved up to `limiter` |
//! | 5 | `source/` out of `config` (done: the poller and the ADS client; each yields a stream of `source::Update`s that only `server::reload` consumes; the first config from the files is read by `server::first_config`, which fingerprints them before reading, so a change made while the server starts is reloaded; over xDS it is the first update); `hitters/` out of `telemetry` (done); the fleet exchange a trait (done: `quota::DemandExchange`) | done |
//! | 6 | one context from `server` (done: `server::Context`; `RateLimiter` hands out none of its parts), counters owned by their subsystems (done: the types stay in `telemetry`, below every subsystem; reloads' held by `server::reload`, TLS's by `server`'s TLS listener, throttle's by `service::ThrottleService`, quota's by `quota::QuotaHub`, admin's by the admin router, statsd's by its push, the heavy hitters by `service::LiveLimits`; `telemetry::RequestStats` keeps `ShouldRateLimit`'s alone); config loads recorded once (done: `server::reload::record`) | done |
//! | 7 | one word a concept: "refund" for giving hits back (done: was also give_back, Undo, remote_undo, unview, uncount; "release" stays the direct API's word for a grant), "store" for the backend (done in `limiter`: `Remote` is `link::Link` in `Mode::Store`, `decide_via_store`, `shard/through_store.rs`, `Commit::InStore`), "verdict" only for the request's (done: telemetry's per-limit `Verdict` is `Counted`, the shard's per-message one `Action`), "stats" for a set of counters (done: telemetry's `Metrics` is `RequestStats`, beside `ThrottleStats`, `QuotaStats`, ...; `telemetry::Counters` gathers them); the breaker's states an enum (done: `BreakerState`) | done |
//!
//! # The walk of one decision
//!
//! One `ShouldRateLimit` decided in memory, file by file; a parent calls each step and takes its
//! result back, and no file is entered twice from below:
//!
//! - (1) `transport/grpc.rs`: the per-call layer opens the span and starts the clock; the
//!   service reads the request (2) and hands it to (3).
//! - (2) `transport/codec/mod.rs`: the request read where it lies, strings borrowed.
//! - (3) `service/mod.rs`: `RateLimiter::decide` calls 4, 5, 8 and 16 in turn.
//! - (4) `service/request.rs`: the request's bounds (`validate`).
//! - (5) `service/plan.rs`: the limits that apply and an op for each, matching in
//!   `descriptor/mod.rs` (6: the node, the counter key's text) and hashing in
//!   `limiter/key.rs` (7).
//! - (8) `limiter/mod.rs`: the engine routes the ops to the shard owning their keys, in place on
//!   this thread (`limiter/same_thread.rs`, 9).
//! - (10) `limiter/shard/mod.rs` dispatches the message to `limiter/shard/decide.rs` (11), which
//!   reads and writes each key's state in `shard/counters.rs` (12, stored in `shard/table.rs`,
//!   13), judges it by `limiter/algorithm.rs` (14), and works out the request's verdict
//!   (`limiter/op.rs`, 15).
//! - (16) `service/answer.rs`: a status per descriptor, counted in `telemetry/mod.rs` and
//!   `telemetry/limit_stats.rs` (17, 18) and the heavy hitters (`hitters/mod.rs`, 19); the
//!   answer is written by 2.
//!
//! That is 19 files, six of which decide something (plan, match, the shard's judgement, the
//! algorithm, the verdict, the answer). The issue that set this pass asked for at most 8; with
//! the shard in owned parts, the key and the verdict in the limiter and each subsystem counting
//! its own, as the same issue asks, 8 would take folding rooms this pass keeps apart on purpose.

pub mod backend;
pub mod cli;
pub mod config;
pub mod descriptor;
pub mod hitters;
pub mod limiter;
pub mod quota;
pub mod server;
pub mod service;
pub mod settings;
pub mod source;
pub mod telemetry;
pub mod transport;
