//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit.
//!
//! Envoy's ratelimit filter calls `ShouldRateLimit` with a domain and descriptors. The gRPC
//! adapter (`transport`) hands the request to [`service::RateLimiter`], which validates it,
//! matches each descriptor against the limit tree (`descriptor`) and plans an op for every
//! limit that applies: a counter key, its hash, the limit's parameters and the hits. The
//! `limiter` engine sends the ops to the shard actors owning their keys (the hash picks one of
//! N); a shard decides the ops of a message together, and a request refused anywhere consumes
//! nothing anywhere, except usage reported after the fact (`hits_addend`), which counts in full.
//! Counting rules are pure functions of the time, which is a parameter (`limiter::Clock`).
//!
//! # The house
//!
//! Modules form layers and every arrow points down. The "uses" column is what the code imports
//! (`crate::…`), checked by `scripts/check-house.py`, which also refuses a cycle between
//! modules or between the files of one module:
//!
//! | module | room for | uses |
//! |---|---|---|
//! | `main.rs`, `cli` | the command line: `serve`, `check`, the binary named `ratelimit` or `limitador-server`, and the settings, telemetry and `server::run` with a shutdown future | `config`, `quota`, `settings`, `telemetry` |
//! | `server` | one `Context` built at start, each adapter handed the parts it uses; listeners, worker runtimes, the admin thread (reloads, the heavy hitters' tick, the statsd push), the durable counters' journal on a thread of its own, TLS, lingering close, the wait while the start waits, drain | `config`, `durable`, `hitters`, `limiter`, `quota`, `service`, `settings`, `source`, `store`, `telemetry`, `transport` |
//! | `settings` | the one reader of the environment: one grammar for booleans, durations, numbers and addresses, a plain typed struct for each subsystem; Limitador's command line mapped onto them | `config`, `durable`, `hitters`, `limiter`, `service`, `source`, `store`, `telemetry`, `transport` |
//! | `source` | where configs come from: files polled by fingerprint, the xDS client (which builds its last push again when the overlay changes); a stream of `Update`s; the thread of the lowest priority every config is built on | `config` |
//! | `transport` | the adapters: gRPC (`ShouldRateLimit`, RLQS, Kuadrant's `CheckRateLimit` and `Report`), HTTP (`/json`, `/rate`, `/throttle`, health, debug, metrics, the status page, the admin listener, Limitador's API), RESP, what each port answers while the start waits | `config`, `descriptor`, `hitters`, `limiter`, `quota`, `service`, `telemetry` |
//! | `durable` | the durable counters (`TURNSTILE_STATE_DIR`): the journal that saves the shards' changes behind the decisions and reads them back at start; the state files' bytes, a state's included (`format`) | `limiter`, `telemetry` |
//! | `store` | the stores shared by replicas, behind `limiter`'s store contract: Redis (connections, key layout, scripts, reply decoding, its errors' counter), and RLQS's demand exchange over it | `config`, `limiter`, `quota`, `telemetry` |
//! | `quota` | RLQS: buckets onto limits, demand, fair shares, the assignments Envoy enforces; the hub the streams share | `config`, `descriptor`, `limiter`, `service`, `telemetry` |
//! | `service` | a request's way through: validate, plan, engine, answer (Limitador's calls too, `limitador`), and its counters (`metrics`: calls, latency, per-limit stats and series); the live limits and the config loads that replace them (`ReloadStats`); the direct APIs' decisions; admin look-ups and resets | `config`, `descriptor`, `hitters`, `limiter`, `telemetry` |
//! | `telemetry` | the exposition and the push: `Metrics`, implemented by each part that counts in its own room, the registry the Prometheus text and statsd loop over; the latency histogram; logs, traces; how client values leave the process | `config` |
//! | `hitters` | heavy hitters: space-saving lists per limit, behind `/debug/top` and the status page | `config`, `descriptor` |
//! | `limiter` | the engine: algorithms, counter keys, shard actors; a shard is its counters, holds, queues and backing (memory, or a link to a store: round trips, breaker, the ledger of hits the store has not counted yet), and its side of a save (`shard/saving.rs`); the store contract | `config`, `telemetry` |
//! | `descriptor` | limit-tree matching and counter keys' text; Limitador's limits matched by their index and CEL | `config` |
//! | `config` | the validated model (units, calendar windows, algorithms, queues, the tree) from YAML, xDS (with the overlay of turnstile's own fields, `overlay`), GoCC's JSON or Limitador's limits file (CEL compiled, `limitador`); no I/O besides reading the files it is given | nothing |
//!
//! `settings` sits above the subsystems because it fills each one's settings struct, so a
//! subsystem never learns where its values came from (linkerd2-proxy's `app/src/env.rs`).
//! `server` lays the runtimes out for speed: one current-thread runtime per worker, each
//! accepting connections and hosting its share of the shards, so a call whose key lives on its
//! own worker decides synchronously. One more thread serves the debug and Prometheus ports and
//! runs the admin tasks; with durable counters, another runs their journal. A new config, from
//! files, SIGHUP or xDS, goes live through one path (`server::reload`), and per-limit stats,
//! bound by stat key, survive it. Each is built beside the config it replaces
//! (`config::Serving`), whose keys, stat keys and lists of limits it shares where they are the
//! same, so a reload holds less than two configs.
//!
//! # Words
//!
//! One word a concept. Retired words, which `scripts/test.sh` refuses in `src/` (this file
//! aside): `give_back` and "give back" in any form (returning hits is a "refund"),
//! `with_backend` and "backend unavailable" (the shared counter place is the "store"),
//! `remote_undo`, `uncount`, `unview` (a "refund"), `into_text`; `Views`, `Away` and
//! `refund_views` (hits decided here that the store has not counted yet are the link's
//! "ledger", local-first or fallback by its `Mode`; a fallback entry sent once the store is
//! back is "replayed"; the count a local-first decision rests on is the key's "view").
//! Renamed so one name means one thing:
//!
//! - the metrics' registry is `telemetry::Registry` (`Counters` is the shard's key table alone).
//! - where counts live: a shard's "backing" is memory alone or a link to a "store"
//!   (`limiter`'s `Backing`); the process's backing is a setting (`settings::Backing`: memory,
//!   memory made durable, or Redis, picked by `BACKEND_TYPE`); a "store" is a counter place shared
//!   by replicas, behind the contract `limiter::Store` (`store::redis::RedisStore`). Retired:
//!   "backend" in any form (`settings::Backend`, the `backend` module), but for the user-facing
//!   `BACKEND_TYPE` and the status JSON's `backend` key, which the status page reads.
//! - the statsd settings are `settings/statsd.rs` ("stats" is a room's counters).
//! - a single Redis reached without the crate's multiplexer is a "plain" connection
//!   (`store/redis/plain.rs`, `Conn::Plain`; retired: `Conn::Direct`, `mod direct`, "direct
//!   connection"): "direct" is the direct APIs' alone (`/rate`, `THROTTLE`, RESP).
//! - a limit that refuses only when every such limit of the request is over is "joint"
//!   (`Role::Joint`, `JointGroup`; retired: `Role::Quota`, `QuotaGroup`, "quota group"): "quota"
//!   is RLQS's (`quota`). The user-facing names stay: YAML `quota_mode` and `QUOTA_MODE`, which
//!   the fields reading them (`quota_mode`, `global_quota_mode`) keep, and "quota" as a role in
//!   the admin look-up's answer.
//! - which hits of a refused request count is the process's `CountingRule` (`UsageInFull`,
//!   `IfAdmitted`, `Always`; retired: `RefusedHits`, `KeepReports`, `KeepNone`, `KeepAll`),
//!   from which the plan draws each op's `Counting` (`Usage`, `IfAdmitted`, `Always`): one rule,
//!   one answer per op, the same words where they agree.
//! - the FIFO of requests waiting for room is a "queue" (the YAML key `queue`): a shard's
//!   `Queues` (`queues.rs`) hold them, `queueing.rs` decides with them; a request in one is a
//!   "waiter" (`TURNSTILE_MAX_WAITERS`), and the process-wide cap on waiters is the
//!   `QueueBudget` (`queue_budget.rs`). Retired: `WaiterBudget`, `mod waiters`, `mod wait`,
//!   "wait queue".
//! - the durable counters' journal writes a "save" each interval (`Journal::save`,
//!   `save_interval`, `Msg::Save`); a "sync" is local-first's exchange with the store alone.
//!   Retired: `DEFAULT_SYNC_INTERVAL`, `sync_errors`, `last_sync_ns`, `Journal::sync`, "walk
//!   of a sync". The setting `TURNSTILE_STATE_SYNC_INTERVAL` and the families
//!   `turnstile_state_syncs_total`, `turnstile_state_sync_errors_total` and
//!   `turnstile_state_last_sync_seconds` keep the names they were published with (the docs
//!   too): their "sync" is the journal's save.
//!
//! Glossed, for words the code keeps:
//!
//! - `Ambient`: what a shard decides within (its clock, its counters, the drain, the answer to a
//!   synchronous caller); the server's context is `Context`. `Delivery`: how a synchronous
//!   caller gets its answer (now, or a channel).
//!   `RespReply`: a plain Redis connection's reply (a shard's answer is the `Reply`).
//! - `Tat`: a token bucket's stored time (theoretical arrival time) and how it is kept.
//! - `lane`: a store connection, one per shard (its index). `head_out`: a queue's head waiter
//!   is out in the store, being decided there. `late`: a local-first key's hits of a fixed
//!   window that ended before their sync went out, sent on their own.
//! - `Scratch`: the states a message's ops would leave, computed once and committed if it is
//!   admitted. `Carried`: what a descriptor counts, worked out once in the plan and carried to
//!   the answer. `Peeking`: a look-up's answer while the store's read is still out.
//! - `spread`: a request whose ops live on several shards. `sticky`: GoCC's `/rate` overrides,
//!   kept for the key once a caller passed them. `book`: RLQS's pure state of streams, buckets
//!   and shares; its `Outbox` is what it asks the caller to send.
//! - `admin`: the admin listener (`TURNSTILE_ADMIN_ADDR`) and what it does, look-ups and resets,
//!   each room doing its part in an `admin.rs` of its own (`transport/http`, `service`,
//!   `limiter/shard`, `store/redis`); the shard's also releases a direct API's grant, which falls
//!   between its decisions the same way. `server/admin.rs` is the thread that serves that
//!   listener with the debug and Prometheus ports, and runs the background tasks.

//! # The walk of one decision
//!
//! One `ShouldRateLimit` decided in memory, on the worker whose shard owns its key, file by file
//! in the order they run; a number is a file's first appearance. `scripts/check-house.py` checks
//! that each file named is called (named in code) by one named before it:
//!
//! - (1) `transport/grpc.rs`: the per-call layer starts its clock and opens the request span,
//!   `telemetry/trace.rs` (2); the service reads the request where it lies in the call's bytes,
//!   `transport/codec/mod.rs` (3).
//! - (4) `service/mod.rs`: `RateLimiter::decide` validates the request, `service/request.rs`
//!   (5), takes the live limits, `service/live.rs` (6), and the domain in them, `config/mod.rs`
//!   (7).
//! - (8) `service/plan.rs`: the limits that apply, matched in `descriptor/mod.rs` (9), each
//!   limit's window from `config/unit.rs` (10), and an op for each: its key hashed in
//!   `limiter/key.rs` (11), its parameters `limiter/algorithm.rs`'s (12), its role and counting
//!   `limiter/op.rs`'s (13).
//! - (14) `limiter/mod.rs`: `Engine::decide` sends the ops as one message,
//!   `limiter/protocol.rs` (15), to the shard owning their key, in place on this thread,
//!   `limiter/same_thread.rs` (16).
//! - (17) `limiter/shard/mod.rs` builds the memory `Decider`: `limiter/shard/decide.rs` (18)
//!   reads the time from `limiter/clock.rs` (19), asks `limiter/shard/queues.rs` (20) whether
//!   anyone waits, reads and writes each key's state in `limiter/shard/counters.rs` (21), stored
//!   in `limiter/shard/table.rs` (22) and counted in `limiter/shard/stats.rs` (23), asks
//!   `limiter/shard/holds.rs` (24) what is held for a limit with `reserve`, judges each op by
//!   (12), and the message by the request's verdict in (15) and (13).
//! - (25) `service/answer.rs`: a status per descriptor, counted in `service/metrics/requests.rs` (26)
//!   and the limit's stats, `service/metrics/limit_stats.rs` (27), offered to the heavy hitters,
//!   `hitters/mod.rs` (28) over `hitters/sketch.rs` (29); a refusal is logged at debug by
//!   `service/refusal.rs` (30).
//! - back in (4): the call and its latency counted in (26), its histogram
//!   `telemetry/histogram.rs` (31); the answer written by (3), the span closed by (1).
//!
//! # The walk of a save (durable counters)
//!
//! Once per `TURNSTILE_STATE_SYNC_INTERVAL`, and once more at the stop after the last answer.
//! It crosses from `durable` into `limiter` once, at `Engine::save`, and back once, with the
//! page:
//!
//! - (1) `server/mod.rs` starts the journal's own thread, `server/journal.rs` (2), beside the
//!   workers and the admin thread, and stops it with them: it runs the journal's task, and at
//!   the stop, once every call is answered, the last save.
//! - (3) `durable/mod.rs`: `Journal::save` asks the engine for what changed (every key, when the
//!   log has outgrown the snapshot).
//! - (4) `limiter/mod.rs`: `Engine::save` sends `Msg::Save`, `limiter/protocol.rs` (5), asking
//!   for a `limiter/saved.rs` (6) page, to each shard in turn, a page at a time: through its
//!   mailbox to the shard's task, `limiter/actor.rs` (7), which hands it to the shard,
//!   `limiter/same_thread.rs` (8).
//! - (9) `limiter/shard/mod.rs` hands it to `limiter/shard/saving.rs` (10), the shard's side
//!   of a save, which takes the keys evicted since the last save from
//!   `limiter/shard/counters.rs` (11) and walks the changed entries of
//!   `limiter/shard/table.rs` (12) from the page's start, clearing their bits, into a page of
//!   at most 32 768 keys.
//! - (13) `durable/format.rs` encodes each page into checksummed frames, each state's bytes by
//!   `durable/format/state.rs` (14), on the blocking pool; `durable/dir.rs` (15) appends them
//!   to the log and syncs it to disk, or streams them into a new snapshot.
//! - (16) `durable/stats.rs`: the save is counted.
//!
//! At start, `server/context.rs` opens the journal before the server serves: `durable/dir.rs`
//! reads the newest snapshot and its log, and `Engine::restore` puts each key into the shard
//! that owns it, through `limiter/shard/saving.rs`.

pub mod cli;
pub mod config;
pub mod descriptor;
pub mod durable;
pub mod hitters;
pub mod limiter;
pub mod quota;
pub mod server;
pub mod service;
pub mod settings;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod transport;
