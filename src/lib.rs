//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit and Limitador.
//!
//! A caller comes in by a door (Envoy's `ShouldRateLimit`, Limitador's API, GoCC's `/rate`, ...).
//! The door's adapter (`transport`) reads the call and hands it to the door's service
//! (`service`), which matches it against the live limits (`descriptor`, `config`) and plans an
//! op for every limit that applies: a counter key, its hash, the limit's parameters, the hits.
//! The engine (`limiter`) sends the ops to the shard actors owning their keys; a shard decides
//! the ops of a message together, in memory or through a store shared by replicas (`store`).
//! Time is a parameter (`limiter::Clock`). docs/architecture.md walks a call through the files,
//! and keeps the words the code uses, one a concept.
//!
//! # The house
//!
//! Modules form layers and every arrow points down. The "uses" column is what the code imports
//! (`crate::…`), checked by `scripts/check-house.py`, which also refuses a cycle between
//! modules or between the files of one module, and checks that each module's `//!` opener
//! names the children this table and the doors table give it:
//!
//! | module | what it holds | uses |
//! |---|---|---|
//! | `main.rs`, `cli` | the command line: `serve`, `check`, `digest`; the binary named `ratelimit` or `limitador-server` | `config`, `service`, `settings`, `telemetry` |
//! | `server` | the start and the stop: one `Context`, the doors built from the settings (`doors`), listeners, worker runtimes, the side thread, the journal's thread, TLS, the one reload path (`reload`), HTTP timeouts, the wait, drain | `config`, `durable`, `hitters`, `limiter`, `service`, `settings`, `source`, `store`, `telemetry`, `transport` |
//! | `settings` | the one reader of the environment and the flags: a typed struct a subsystem; Limitador's command line (`limitador`) | `config`, `durable`, `hitters`, `limiter`, `service`, `source`, `store`, `telemetry`, `transport` |
//! | `source` | where configs come from: files polled by fingerprint, the xDS client (`xds`) | `config` |
//! | `transport` | the adapters, a door's in a file of its name: gRPC (`grpc`, `codec`, `limitador`, `rlqs`), HTTP (`http`), RESP (`throttle`), what a port answers while the start waits (`waiting`) | `config`, `descriptor`, `hitters`, `limiter`, `service`, `telemetry` |
//! | `durable` | the durable counters: the journal that saves the shards' changes and reads them back at start; the state files' bytes (`format`) | `limiter`, `telemetry` |
//! | `store` | the stores replicas share, behind `limiter`'s store contract: Redis (`redis`) | `config`, `limiter`, `service`, `telemetry` |
//! | `service` | each door's service (`envoy`, `limitador`, `gocc`, `throttle`, `rlqs`) and what they share: bounds, plan, answer, the live limits, the request series (`metrics`), admin look-ups | `config`, `descriptor`, `hitters`, `limiter`, `telemetry` |
//! | `telemetry` | the exposition and the push (`Metrics`, `Registry`), the latency histogram, logs, traces, how client values leave the process | `config` |
//! | `hitters` | heavy hitters: space-saving lists per limit | `config`, `descriptor` |
//! | `limiter` | the engine: algorithms, counter keys, shard actors (`shard`: counters, holds, queues, the link to a store), the store contract | `config`, `telemetry` |
//! | `descriptor` | limit-tree matching and counter keys' text; Limitador's limits matched by index and CEL (`limitador`) | `config` |
//! | `config` | the validated model from YAML, xDS (`xds`, `overlay`), GoCC's JSON (`gocc`) or Limitador's limits file (`limitador`); no I/O besides reading the files it is given | nothing |
//!
//! `settings` sits above the subsystems because it fills each one's settings struct, so a
//! subsystem never learns where its values came from (linkerd2-proxy's `app/src/env.rs`).
//! `server` lays the runtimes out for speed: one current-thread runtime per worker, each
//! accepting connections and hosting its share of the shards, so a call whose key lives on its
//! own worker decides synchronously.
//!
//! # The doors
//!
//! A door is named one way in every layer, for the client it answers as (the `door` label of
//! `ratelimit_service_requests_total`: `envoy`, `limitador`, `gocc`, `throttle`), or for the
//! protocol where it is another of Envoy's (`rlqs`, `xds`). A module with children is a
//! folder with its `mod.rs`. `server/doors.rs` builds the doors from the settings, in one
//! `match`; the rest of `server` names none (checked). Envoy's service is also what the admin
//! look-ups plan with. A door's black-box tests carry its name too: `tests/it/envoy/`,
//! `tests/it/limitador/`, `tests/it/direct/gocc.rs`, `tests/it/direct/throttle.rs`,
//! `tests/it/rlqs/`, `tests/it/source/xds.rs`.
//!
//! | door | settings | config | service | transport |
//! |---|---|---|---|---|
//! | `envoy`: `ShouldRateLimit`, `/json` | `settings/mod.rs` | `config/mod.rs` | `service/envoy.rs` | `transport/grpc.rs` (the RLS port's), `transport/http/envoy.rs` |
//! | `limitador`: as `limitador-server` | `settings/limitador/mod.rs` | `config/limitador/mod.rs`, `descriptor/limitador.rs` | `service/limitador/mod.rs` | `transport/limitador.rs`, `transport/http/limitador.rs` |
//! | `gocc`: `/rate` | `settings/gocc.rs` | `config/gocc.rs`, `config/build/gocc.rs` | `service/gocc/mod.rs` | `transport/http/gocc.rs` |
//! | `throttle`: `THROTTLE`, `CL.THROTTLE`, `/throttle` | `settings/throttle.rs` | (none) | `service/throttle/mod.rs` | `transport/throttle/mod.rs`, `transport/http/throttle.rs` |
//! | `rlqs`: Envoy's quota streams | `settings/mod.rs` | `config/mod.rs` | `service/rlqs/mod.rs` | `transport/rlqs.rs` |
//! | `xds`: config from Envoy Gateway | `settings/xds.rs` | `config/xds/mod.rs` | (none) | `source/xds/mod.rs` |
//!
//! What every door keeps is kept where doors are served, so a door cannot leave it out: bounds
//! (`service::within_bounds`, `transport/http/bounds.rs`), client values as the listener shows
//! them (`telemetry::Shown`), calls, errors, latency and a span (`transport/grpc.rs`'s
//! `CallLayer`, `transport/http/calls.rs`, the RESP command loop), one reload path
//! (`server/reload.rs`), the wait's answers (`transport/waiting.rs`), HTTP timeouts
//! (`server/http_conn.rs`). Adding a door takes its files in the layers it needs, named for it;
//! one arm in `Doors::build`; one row in `tests/it/server/doors.rs`, which walks every door
//! against every promise.

pub mod cli;
pub mod config;
pub mod descriptor;
pub mod durable;
pub mod hitters;
pub mod limiter;
pub mod server;
pub mod service;
pub mod settings;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod transport;
